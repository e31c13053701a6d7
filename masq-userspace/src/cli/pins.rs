//! The pinned datapath as the commands working on it (`masq status`, `masq nat list`,
//! `masq uninstall`) name and open it, while an agent runs or after it stopped.

use std::{
    path::{Path, PathBuf},
    process::ExitCode,
};

use clap::Args;
use masq::datapath::{maps::DatapathMaps, pins::DEFAULT_PIN_PATH};

use super::check_config::fail;
use masq::causes::WithCauses;

/// Where the agent pins its maps and links.
#[derive(Args, Debug)]
pub(crate) struct PinArgs {
    /// bpffs directory the agent pins its maps and links under.
    #[arg(long, value_name = "DIR", default_value = DEFAULT_PIN_PATH)]
    pub(crate) pin_path: PathBuf,
}

/// The maps pinned under `pin_path`; when there are none, the exit code after saying why.
pub(crate) fn open(pin_path: &Path) -> Result<DatapathMaps, ExitCode> {
    DatapathMaps::from_pins(pin_path).map_err(|error| fail(&WithCauses(&error).to_string()))
}
