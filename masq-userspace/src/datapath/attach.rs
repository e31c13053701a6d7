//! Attaching the classifiers to the uplink with tcx links pinned under the pin directory.
//!
//! A pinned link keeps the program attached when the agent exits or is killed. A new agent
//! swaps its freshly loaded program into the existing link (`BPF_LINK_UPDATE`), so packets
//! never see a moment without a program, and never two.

use aya::{
    programs::{
        LinkOrder, ProgramError, SchedClassifier, TcAttachType,
        links::{FdLink, LinkError, PinnedLink},
        tc::{SchedClassifierLink, TcAttachOptions},
    },
    sys::SyscallError,
};
use masq_common::layout::{PROG_EGRESS, PROG_INGRESS};

use super::{
    error::DatapathError,
    object::Datapath,
    pins::{Hook, PinDir},
};

/// What attaching did for one hook.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AttachOutcome {
    /// A new link was created and pinned.
    Created,
    /// The pinned link now runs the new program.
    Replaced,
    /// The pinned link was no longer attached (its interface went away); a new one replaced it.
    Recreated,
}

/// Attaches both programs to `interface`, adopting pinned links where they exist, and removes
/// pinned links of other interfaces (the uplink changed).
pub fn attach(
    datapath: &mut Datapath,
    pins: &PinDir,
    interface: &str,
) -> Result<[(Hook, AttachOutcome); 2], DatapathError> {
    let egress = attach_one(
        datapath.egress_mut()?,
        PROG_EGRESS,
        pins,
        interface,
        Hook::Egress,
    )?;
    let ingress = attach_one(
        datapath.ingress_mut()?,
        PROG_INGRESS,
        pins,
        interface,
        Hook::Ingress,
    )?;
    for (_, other_interface, path) in pins.links() {
        if other_interface != interface {
            tracing::warn!(link = %path.display(), "detaching masq from {other_interface}, which is no longer the uplink");
            std::fs::remove_file(&path).map_err(|source| DatapathError::Io {
                what: "removing",
                path,
                source,
            })?;
        }
    }
    Ok([(Hook::Egress, egress), (Hook::Ingress, ingress)])
}

fn attach_type(hook: Hook) -> TcAttachType {
    match hook {
        Hook::Egress => TcAttachType::Egress,
        Hook::Ingress => TcAttachType::Ingress,
    }
}

fn attach_one(
    program: &mut SchedClassifier,
    name: &'static str,
    pins: &PinDir,
    interface: &str,
    hook: Hook,
) -> Result<AttachOutcome, DatapathError> {
    let path = pins.link(hook, interface);
    let mut outcome = AttachOutcome::Created;
    match PinnedLink::from_pin(&path) {
        Ok(pinned) => {
            let link = SchedClassifierLink::try_from(FdLink::from(pinned)).map_err(|error| {
                DatapathError::Link {
                    path: path.clone(),
                    detail: error.to_string(),
                }
            })?;
            // A tcx link whose device went away refuses updates with ENOLINK; one that takes the
            // update is attached and now runs the new program. No need to list the device's
            // programs, which would take CAP_SYS_ADMIN (BPF_PROG_GET_FD_BY_ID).
            match program.attach_to_link(link) {
                Ok(link_id) => {
                    // The pin keeps the link; dropping our handle must not detach it.
                    drop(
                        program
                            .take_link(link_id)
                            .map_err(DatapathError::program("releasing link of", name))?,
                    );
                    return Ok(AttachOutcome::Replaced);
                }
                Err(ProgramError::SyscallError(SyscallError { io_error, .. }))
                    if io_error.raw_os_error() == Some(libc::ENOLINK) => {}
                Err(error) => return Err(DatapathError::program("replacing in link", name)(error)),
            }
            tracing::warn!(link = %path.display(), "pinned link is defunct (interface recreated?); creating a new one");
            std::fs::remove_file(&path).map_err(|source| DatapathError::Io {
                what: "removing",
                path: path.clone(),
                source,
            })?;
            outcome = AttachOutcome::Recreated;
        }
        Err(LinkError::SyscallError(error))
            if error.io_error.kind() == std::io::ErrorKind::NotFound => {}
        Err(error) => {
            return Err(DatapathError::Link {
                path: path.clone(),
                detail: error.to_string(),
            });
        }
    }
    let link_id = program
        .attach_with_options(
            interface,
            attach_type(hook),
            TcAttachOptions::TcxOrder(LinkOrder::default()),
        )
        .map_err(DatapathError::program("attaching", name))?;
    let link = program
        .take_link(link_id)
        .map_err(DatapathError::program("taking link of", name))?;
    let fd_link = FdLink::try_from(link).map_err(|error| DatapathError::Link {
        path: path.clone(),
        detail: error.to_string(),
    })?;
    fd_link.pin(&path).map_err(|source| DatapathError::Pin {
        what: format!("{} link", hook.name()),
        path,
        source,
    })?;
    Ok(outcome)
}

/// The ids of the programs attached to `interface` at `hook` (for `masq status`).
pub fn attached_program_names(interface: &str, hook: Hook) -> Result<Vec<String>, DatapathError> {
    let name = match hook {
        Hook::Egress => PROG_EGRESS,
        Hook::Ingress => PROG_INGRESS,
    };
    let (_, attached) = SchedClassifier::query_tcx(interface, attach_type(hook))
        .map_err(DatapathError::program("querying tcx for", name))?;
    Ok(attached
        .iter()
        .map(|info| format!("{} (id {})", info.name_as_str().unwrap_or("?"), info.id()))
        .collect())
}
