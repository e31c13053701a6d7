//! A second, stateful tc program for the tests of masq next to other programs on a hook: it
//! remembers the IPv4 source and destination of the last packet it saw, as a host firewall or a
//! flow exporter keys its state. Built from raw instructions and loaded with `bpf(2)` so that
//! it is nothing of masq's: a stranger on the hook.

use std::{
    ffi::CString,
    io,
    net::Ipv4Addr,
    os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd},
    path::Path,
};

use crate::netns::Netns;

/// `bpf(2)` commands.
const BPF_MAP_CREATE: libc::c_long = 0;
const BPF_MAP_LOOKUP_ELEM: libc::c_long = 1;
const BPF_PROG_LOAD: libc::c_long = 5;
const BPF_OBJ_PIN: libc::c_long = 6;
const BPF_LINK_CREATE: libc::c_long = 28;
const BPF_MAP_TYPE_ARRAY: u32 = 2;
const BPF_PROG_TYPE_SCHED_CLS: u32 = 3;
/// tcx attach types, and the flags that place a link before or after every other one.
const BPF_TCX_INGRESS: u32 = 46;
const BPF_TCX_EGRESS: u32 = 47;
const BPF_F_BEFORE: u32 = 1 << 3;
const BPF_F_AFTER: u32 = 1 << 4;

/// One hook of an interface.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Hook {
    Ingress,
    Egress,
}

impl Hook {
    const fn tcx(self) -> u32 {
        match self {
            Self::Ingress => BPF_TCX_INGRESS,
            Self::Egress => BPF_TCX_EGRESS,
        }
    }

    const fn tc(self) -> &'static str {
        match self {
            Self::Ingress => "ingress",
            Self::Egress => "egress",
        }
    }
}

/// The observer: its map and program, and the tcx link that holds it on a hook (tc filters hold
/// their program themselves).
#[derive(Debug)]
pub struct Observer {
    map: OwnedFd,
    program: OwnedFd,
    _link: Option<OwnedFd>,
}

fn bpf<T>(command: libc::c_long, attr: &mut T) -> io::Result<i64> {
    // SAFETY: `attr` is a valid `bpf_attr` prefix of the size passed, and lives across the call.
    let result = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            command,
            std::ptr::from_mut(attr),
            size_of::<T>(),
        )
    };
    if result < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(result)
}

fn owned(fd: i64) -> io::Result<OwnedFd> {
    let fd = i32::try_from(fd).map_err(io::Error::other)?;
    // SAFETY: the kernel just returned this descriptor, which nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// An eBPF instruction: opcode, registers (dst low nibble, src high), offset, immediate.
const fn insn(code: u8, dst: u8, src: u8, off: i16, imm: i32) -> [u8; 8] {
    let [o0, o1] = off.to_le_bytes();
    let [i0, i1, i2, i3] = imm.to_le_bytes();
    [code, dst | (src << 4), o0, o1, i0, i1, i2, i3]
}

/// The program: IPv4 over Ethernet only; the source and destination go to slot 0 of `map`.
fn instructions(map: i32) -> Vec<[u8; 8]> {
    const LDX_W: u8 = 0x61; // r_dst = *(u32 *)(r_src + off)
    const LDX_H: u8 = 0x69;
    const STX_W: u8 = 0x63;
    const ST_W: u8 = 0x62;
    const MOV64_X: u8 = 0xbf;
    const MOV64_K: u8 = 0xb7;
    const ADD64_K: u8 = 0x07;
    const JGT_X: u8 = 0x2d;
    const JNE_K: u8 = 0x55;
    const JEQ_K: u8 = 0x15;
    const CALL: u8 = 0x85;
    const EXIT: u8 = 0x95;
    const LD_IMM64: u8 = 0x18;
    const PSEUDO_MAP_FD: u8 = 1;
    // `struct __sk_buff`: data at 76, data_end at 80.
    let program = [
        insn(MOV64_X, 6, 1, 0, 0),
        insn(LDX_W, 2, 6, 76, 0),
        insn(LDX_W, 3, 6, 80, 0),
        insn(MOV64_X, 4, 2, 0, 0),
        insn(ADD64_K, 4, 0, 0, 34),
        insn(JGT_X, 4, 3, 13, 0), // past the end: out
        insn(LDX_H, 5, 2, 12, 0),
        insn(JNE_K, 5, 0, 11, 0x0008), // not IPv4 (0x0800 as it lies in memory): out
        insn(LDX_W, 7, 2, 26, 0),
        insn(LDX_W, 8, 2, 30, 0),
        insn(ST_W, 10, 0, -4, 0),
        insn(MOV64_X, 2, 10, 0, 0),
        insn(ADD64_K, 2, 0, 0, -4),
        insn(LD_IMM64, 1, PSEUDO_MAP_FD, 0, map),
        insn(0, 0, 0, 0, 0),
        insn(CALL, 0, 0, 0, 1), // bpf_map_lookup_elem
        insn(JEQ_K, 0, 0, 2, 0),
        insn(STX_W, 0, 7, 0, 0),
        insn(STX_W, 0, 8, 4, 0),
        // out: TC_ACT_UNSPEC (tcx: the next program), so what follows still runs.
        insn(MOV64_K, 0, 0, 0, -1),
        insn(EXIT, 0, 0, 0, 0),
    ];
    program.to_vec()
}

impl Observer {
    /// Loads a new observer (not attached anywhere yet).
    pub fn load() -> io::Result<Self> {
        #[repr(C)]
        #[derive(Default)]
        struct MapAttr {
            map_type: u32,
            key_size: u32,
            value_size: u32,
            max_entries: u32,
            map_flags: u32,
        }
        let map = owned(bpf(
            BPF_MAP_CREATE,
            &mut MapAttr {
                map_type: BPF_MAP_TYPE_ARRAY,
                key_size: 4,
                value_size: 8,
                max_entries: 1,
                ..MapAttr::default()
            },
        )?)?;
        #[repr(C)]
        #[derive(Default)]
        struct LoadAttr {
            prog_type: u32,
            insn_cnt: u32,
            insns: u64,
            license: u64,
            log_level: u32,
            log_size: u32,
            log_buf: u64,
            kern_version: u32,
            prog_flags: u32,
        }
        let code = instructions(map.as_raw_fd());
        let license = CString::from(c"GPL");
        let mut log = vec![0u8; 65_536];
        let mut attr = LoadAttr {
            prog_type: BPF_PROG_TYPE_SCHED_CLS,
            insn_cnt: u32::try_from(code.len()).map_err(io::Error::other)?,
            insns: code.as_ptr() as u64,
            license: license.as_ptr() as u64,
            log_level: 1,
            log_size: u32::try_from(log.len()).map_err(io::Error::other)?,
            log_buf: log.as_mut_ptr() as u64,
            ..LoadAttr::default()
        };
        let program = bpf(BPF_PROG_LOAD, &mut attr).map_err(|error| {
            let end = log.iter().position(|&byte| byte == 0).unwrap_or(log.len());
            io::Error::other(format!(
                "loading the observer: {error}: {}",
                String::from_utf8_lossy(&log[..end])
            ))
        })?;
        Ok(Self {
            map,
            program: owned(program)?,
            _link: None,
        })
    }

    /// Attaches the observer to `hook` of `device` in `netns` by a tcx link, first or last.
    pub fn attach_tcx(mut self, netns: &Netns, device: &str, hook: Hook, first: bool) -> Self {
        #[repr(C)]
        #[derive(Default)]
        struct LinkAttr {
            prog_fd: u32,
            target_ifindex: u32,
            attach_type: u32,
            flags: u32,
            relative_fd: u32,
            pad: u32,
            expected_revision: u64,
        }
        let program = u32::try_from(self.program.as_raw_fd()).unwrap_or(u32::MAX);
        let link = netns
            .enter(|| {
                let ifindex = nix::net::if_::if_nametoindex(device).map_err(io::Error::from)?;
                bpf(
                    BPF_LINK_CREATE,
                    &mut LinkAttr {
                        prog_fd: program,
                        target_ifindex: ifindex,
                        attach_type: hook.tcx(),
                        flags: if first { BPF_F_BEFORE } else { BPF_F_AFTER },
                        ..LinkAttr::default()
                    },
                )
            })
            .and_then(owned)
            .unwrap_or_else(|error| panic!("attaching the observer to {device}: {error}"));
        self._link = Some(link);
        self
    }

    /// Attaches the observer to `hook` of `device` in `netns` as a direct-action tc filter at
    /// `priority`, through a pin under `pin_dir` (what `tc` loads a program from).
    pub fn attach_tc(
        self,
        netns: &Netns,
        device: &str,
        hook: Hook,
        priority: u16,
        pin_dir: &Path,
    ) -> Self {
        #[repr(C)]
        #[derive(Default)]
        struct PinAttr {
            pathname: u64,
            bpf_fd: u32,
            file_flags: u32,
        }
        /// Removes the pin and its directory however the attach ends: `tc` holds the program
        /// once its filter exists, and a failed attach must not leave bpffs entries behind.
        struct Pin<'a>(&'a Path, std::path::PathBuf);
        impl Drop for Pin<'_> {
            fn drop(&mut self) {
                let _ = std::fs::remove_file(&self.1);
                let _ = std::fs::remove_dir(self.0);
            }
        }
        std::fs::create_dir_all(pin_dir)
            .unwrap_or_else(|error| panic!("creating {}: {error}", pin_dir.display()));
        let pin = Pin(pin_dir, pin_dir.join(format!("observer-{}", hook.tc())));
        let path = CString::new(pin.1.to_string_lossy().as_bytes()).unwrap_or_default();
        bpf(
            BPF_OBJ_PIN,
            &mut PinAttr {
                pathname: path.as_ptr() as u64,
                bpf_fd: u32::try_from(self.program.as_raw_fd()).unwrap_or(u32::MAX),
                ..PinAttr::default()
            },
        )
        .unwrap_or_else(|error| panic!("pinning the observer at {}: {error}", pin.1.display()));
        netns.exec(
            "tc",
            &[
                "filter",
                "add",
                "dev",
                device,
                hook.tc(),
                "pref",
                &priority.to_string(),
                "bpf",
                "object-pinned",
                &pin.1.to_string_lossy(),
                "da",
            ],
        );
        drop(pin);
        self
    }

    /// The source and destination of the last IPv4 packet the observer saw.
    pub fn last_seen(&self) -> (Ipv4Addr, Ipv4Addr) {
        #[repr(C)]
        #[derive(Default)]
        struct LookupAttr {
            map_fd: u32,
            pad: u32,
            key: u64,
            value: u64,
            flags: u64,
        }
        let key = 0u32;
        let mut value = [0u8; 8];
        bpf(
            BPF_MAP_LOOKUP_ELEM,
            &mut LookupAttr {
                map_fd: u32::try_from(self.map.as_raw_fd()).unwrap_or(u32::MAX),
                key: std::ptr::from_ref(&key) as u64,
                value: value.as_mut_ptr() as u64,
                ..LookupAttr::default()
            },
        )
        .unwrap_or_else(|error| panic!("reading the observer's map: {error}"));
        (
            Ipv4Addr::new(value[0], value[1], value[2], value[3]),
            Ipv4Addr::new(value[4], value[5], value[6], value[7]),
        )
    }
}
