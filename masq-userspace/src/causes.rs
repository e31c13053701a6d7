//! An error shown with its causes on one line.
//!
//! masq's error types say what failed and leave why to [`Error::source`], as the standard
//! library and aya do, so that each cause is said once however deep the chain. Whoever shows
//! an error to a person (a log line, a command's message, `masq status`) walks the chain here.

use std::{error::Error, fmt};

/// `error: cause: cause's cause`, for logs and messages.
#[derive(Clone, Copy)]
pub struct WithCauses<'a>(pub &'a (dyn Error + 'static));

impl fmt::Display for WithCauses<'_> {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(formatter, "{}", self.0)?;
        let mut cause = self.0.source();
        while let Some(error) = cause {
            write!(formatter, ": {error}")?;
            cause = error.source();
        }
        Ok(())
    }
}

impl fmt::Debug for WithCauses<'_> {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, formatter)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("reading the table")]
    struct Outer(#[source] std::io::Error);

    #[test]
    fn each_cause_follows_once() {
        let error = Outer(std::io::Error::other("the disk is gone"));
        assert_eq!(error.to_string(), "reading the table");
        assert_eq!(
            WithCauses(&error).to_string(),
            "reading the table: the disk is gone"
        );
    }

    #[test]
    fn an_error_without_a_cause_is_itself() {
        let error = std::io::Error::other("plain");
        assert_eq!(WithCauses(&error).to_string(), "plain");
    }
}
