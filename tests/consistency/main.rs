//! What masq ships agrees with itself: the rendered manifests with what the agent needs, the
//! docs with the agent's flags, the kernels it runs on and the files they link to, and every
//! place that decides the masquerade policy with the others.
//!
//! * [`deploy`]: the manifests `kubectl apply -k` creates, and docs/configuration.md against
//!   `masq agent --help` (needs kubectl, not root);
//! * [`docs`]: every relative link of README.md and docs/*.md reaches its file and heading (no
//!   root);
//! * [`kernel_compat`]: the datapath object against the minimum kernels of docs/kernels.md
//!   (no root);
//! * [`policy_agreement`]: `masq explain`, the datapath and the iptables rules decide alike
//!   (needs root and iptables).

mod deploy;
mod docs;
mod kernel_compat;
mod policy_agreement;
