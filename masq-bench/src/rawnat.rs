//! The baseline's NAT table, used without knowing its layout.
//!
//! The baseline agent (`--baseline-agent`) is another revision's `masq`: it embeds its own
//! datapath, whose keys and values may differ from this revision's types, so its maps are
//! never opened as this revision's `DatapathMaps`. What every revision shares is all that is
//! used here: the table is a hash map pinned as `masq_nat_v4` (`masq_nat_v6`) in the agent's pin
//! directory, and a flow takes two entries, one for each direction. Keys are handled as bytes
//! of the size the kernel reports for the map.

use std::{
    collections::HashSet,
    os::fd::{AsFd as _, AsRawFd as _, BorrowedFd},
    path::Path,
};

use anyhow::{Context as _, Result, bail};
use aya::maps::MapData;
use masq_common::layout::{MAP_NAT_V4, MAP_NAT_V6};

use crate::frames::Family;

/// `BPF_MAP_DELETE_ELEM` in `enum bpf_cmd`.
const BPF_MAP_DELETE_ELEM: libc::c_long = 3;
/// `BPF_MAP_GET_NEXT_KEY` in `enum bpf_cmd`.
const BPF_MAP_GET_NEXT_KEY: libc::c_long = 4;

/// The element-command member of `union bpf_attr` (`include/uapi/linux/bpf.h`).
#[repr(C)]
#[derive(Default)]
struct ElemAttr {
    map_fd: u32,
    _pad: u32,
    key: u64,
    /// `value`, or `next_key` for `BPF_MAP_GET_NEXT_KEY`.
    value: u64,
    flags: u64,
}

/// `bpf(command)` on an element of `map`: `key` (none: the first key) and, for the next-key
/// command, where the kernel writes the next key. Both are exactly `key_size` bytes long.
fn element(
    command: libc::c_long,
    map: BorrowedFd<'_>,
    key_size: usize,
    key: Option<&[u8]>,
    next_key: Option<&mut [u8]>,
) -> std::io::Result<()> {
    if key.is_some_and(|key| key.len() != key_size)
        || next_key.as_ref().is_some_and(|next| next.len() != key_size)
    {
        return Err(std::io::Error::from(std::io::ErrorKind::InvalidInput));
    }
    let mut attr = ElemAttr {
        map_fd: u32::try_from(map.as_raw_fd()).unwrap_or(u32::MAX),
        key: key.map_or(0, |key| key.as_ptr() as u64),
        value: next_key.map_or(0, |next| next.as_mut_ptr() as u64),
        ..ElemAttr::default()
    };
    // SAFETY: `attr` is a valid `bpf_attr` prefix for the element commands, of the size passed.
    // Its pointers are null or point to buffers of the map's key size (checked above) that
    // outlive the call; the kernel reads `key` and writes at most `key_size` bytes to
    // `next_key`.
    let result = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            command,
            std::ptr::from_mut(&mut attr),
            size_of::<ElemAttr>(),
        )
    };
    if result < 0 {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// One family's NAT table of the baseline's datapath.
#[derive(Debug)]
pub(crate) struct RawTable {
    map: MapData,
    key_size: usize,
    /// The entries the table held when [`RawTable::keep_current`] last ran.
    kept: HashSet<Box<[u8]>>,
}

impl RawTable {
    /// Opens `family`'s table pinned under `pin_dir`.
    pub(crate) fn open(pin_dir: &Path, family: Family) -> Result<Self> {
        let name = match family {
            Family::V4 => MAP_NAT_V4,
            Family::V6 => MAP_NAT_V6,
        };
        let path = pin_dir.join(name);
        let map = MapData::from_pin(&path)
            .with_context(|| format!("opening the baseline's {}", path.display()))?;
        let key_size = usize::try_from(map.info()?.key_size())?;
        if key_size == 0 {
            bail!("the baseline's {name} has keys of no size");
        }
        Ok(Self {
            map,
            key_size,
            kept: HashSet::new(),
        })
    }

    /// Calls `each` with every key in the table (a walk: entries created or deleted meanwhile
    /// may be missed).
    fn walk(&self, mut each: impl FnMut(&[u8])) -> Result<()> {
        let fd = self.map.fd().as_fd();
        let mut key = vec![0u8; self.key_size];
        let mut next = vec![0u8; self.key_size];
        let mut first = true;
        loop {
            let current = (!first).then_some(key.as_slice());
            match element(
                BPF_MAP_GET_NEXT_KEY,
                fd,
                self.key_size,
                current,
                Some(&mut next),
            ) {
                Ok(()) => {}
                Err(error) if error.raw_os_error() == Some(libc::ENOENT) => return Ok(()),
                Err(error) => return Err(error).context("walking the baseline's NAT table"),
            }
            each(&next);
            std::mem::swap(&mut key, &mut next);
            first = false;
        }
    }

    /// Entries in the table.
    pub(crate) fn entries(&self) -> Result<u64> {
        let mut count = 0;
        self.walk(|_| count += 1)?;
        Ok(count)
    }

    /// Remembers the entries the table holds now: what [`RawTable::forget_new`] leaves.
    pub(crate) fn keep_current(&mut self) -> Result<()> {
        let mut kept = HashSet::new();
        self.walk(|key| {
            kept.insert(Box::from(key));
        })?;
        self.kept = kept;
        Ok(())
    }

    /// Deletes every entry that came after the last [`RawTable::keep_current`] (a window's
    /// flows, as the garbage collector frees expired flows on a busy node); returns how many
    /// flows they were (two entries each).
    pub(crate) fn forget_new(&self) -> Result<u64> {
        let mut new = Vec::new();
        self.walk(|key| {
            if !self.kept.contains(key) {
                new.push(Box::<[u8]>::from(key));
            }
        })?;
        let fd = self.map.fd().as_fd();
        let mut removed = 0;
        for key in &new {
            match element(BPF_MAP_DELETE_ELEM, fd, self.key_size, Some(key), None) {
                Ok(()) => removed += 1,
                // Deleted meanwhile (by the agent's collector).
                Err(error) if error.raw_os_error() == Some(libc::ENOENT) => {}
                Err(error) => {
                    return Err(error).context("deleting from the baseline's NAT table");
                }
            }
        }
        Ok(removed / 2)
    }
}
