//! A safe, owned view of libyaml's event parser (`unsafe-libyaml`, the C library transpiled).
//!
//! go-yaml v2 is itself a Go port of libyaml, so its grammar, its error texts and its
//! (off-by-one) line numbers come from the same code. This module only turns the C-style API
//! into owned Rust values; where go-yaml v2 departs from libyaml 0.2.5 is handled by the caller.

use std::{ffi::CStr, mem::MaybeUninit, ptr::NonNull};

use unsafe_libyaml as unsafe_sys;

/// A position in the input: the byte offset and the 0-based line.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Mark {
    pub(crate) index: usize,
    pub(crate) line: usize,
}

/// The libyaml events go-yaml's composer consumes.
#[derive(Debug)]
pub(crate) enum Event {
    StreamEnd,
    DocumentStart {
        /// `%YAML major.minor`, if the document has the directive.
        version: Option<(i32, i32)>,
    },
    DocumentEnd,
    Alias {
        anchor: String,
    },
    Scalar {
        anchor: Option<String>,
        tag: String,
        value: String,
        plain_implicit: bool,
        double_quoted: bool,
        plain: bool,
    },
    SequenceStart {
        anchor: Option<String>,
        flow: bool,
    },
    MappingStart {
        anchor: Option<String>,
        flow: bool,
    },
    CollectionEnd,
    /// Stream start and anything else go-yaml passes over.
    Other,
}

/// libyaml's error state, the parts go-yaml's `fail` reads.
#[derive(Clone, Debug)]
pub(crate) struct ParseError {
    pub(crate) scanner: bool,
    pub(crate) problem: String,
    pub(crate) problem_mark: Mark,
    pub(crate) context_mark: Mark,
}

impl ParseError {
    /// go-yaml's `parser.fail`: the problem mark's line (plus one for scanner errors, which
    /// "don't iterate line"), else the context mark's line, omitted when zero.
    pub(crate) fn line(&self) -> Option<usize> {
        let line = if self.problem_mark.line != 0 {
            self.problem_mark.line + usize::from(self.scanner)
        } else {
            self.context_mark.line
        };
        (line != 0).then_some(line)
    }
}

/// A libyaml parser over a byte string it owns.
pub(crate) struct Parser {
    raw: NonNull<unsafe_sys::yaml_parser_t>,
    /// The input libyaml reads from; it must outlive `raw` and never move its heap buffer.
    _input: Box<[u8]>,
}

fn mark(raw: unsafe_sys::yaml_mark_t) -> Mark {
    Mark {
        index: usize::try_from(raw.index).unwrap_or(usize::MAX),
        line: usize::try_from(raw.line).unwrap_or(usize::MAX),
    }
}

/// Copies a NUL-terminated libyaml string.
///
/// # Safety
///
/// `text` is null or points to a NUL-terminated string that lives for the call.
unsafe fn owned(text: *const u8) -> Option<String> {
    if text.is_null() {
        return None;
    }
    // SAFETY: non-null and NUL-terminated, as the caller guarantees.
    let text = unsafe { CStr::from_ptr(text.cast()) };
    Some(String::from_utf8_lossy(text.to_bytes()).into_owned())
}

impl Parser {
    /// A parser reading `input`.
    pub(crate) fn new(input: &[u8]) -> Self {
        let input: Box<[u8]> = input.into();
        let raw = Box::into_raw(Box::new(MaybeUninit::<unsafe_sys::yaml_parser_t>::zeroed()))
            .cast::<unsafe_sys::yaml_parser_t>();
        // SAFETY: `raw` points to zeroed memory the size of a parser, which
        // `yaml_parser_initialize` fills in; the input slice lives as long as the parser (it is
        // owned by `Self`, and a boxed slice's heap buffer does not move).
        unsafe {
            // Initialisation only fails when memory allocation does, which aborts in Rust.
            let _ = unsafe_sys::yaml_parser_initialize(raw);
            unsafe_sys::yaml_parser_set_input_string(raw, input.as_ptr(), input.len() as u64);
        }
        Self {
            raw: NonNull::new(raw).unwrap_or(NonNull::dangling()),
            _input: input,
        }
    }

    /// The next event, with its start and end marks.
    pub(crate) fn next(&mut self) -> Result<(Event, Mark, Mark), ParseError> {
        let mut event = MaybeUninit::<unsafe_sys::yaml_event_t>::zeroed();
        // SAFETY: `self.raw` is an initialised parser whose input is alive; `event` is writable
        // memory for one event.
        let parsed =
            unsafe { unsafe_sys::yaml_parser_parse(self.raw.as_ptr(), event.as_mut_ptr()) };
        if parsed.fail {
            // SAFETY: the parser is initialised; after a failure its error fields are set and
            // `problem` is null or a static NUL-terminated string.
            let parser = unsafe { self.raw.as_ref() };
            return Err(ParseError {
                scanner: parser.error == unsafe_sys::YAML_SCANNER_ERROR,
                // SAFETY: see above.
                problem: unsafe { owned(parser.problem.cast()) }.unwrap_or_default(),
                problem_mark: mark(parser.problem_mark),
                context_mark: mark(parser.context_mark),
            });
        }
        // SAFETY: a successful parse initialised the event.
        let event = unsafe { event.assume_init_mut() };
        // SAFETY: the union member read is the one `type_` names, and its strings are
        // NUL-terminated (scalar values may hold NULs, so they are read by length).
        let converted = unsafe {
            match event.type_ {
                unsafe_sys::YAML_STREAM_END_EVENT => Event::StreamEnd,
                unsafe_sys::YAML_DOCUMENT_START_EVENT => {
                    let version = event.data.document_start.version_directive;
                    Event::DocumentStart {
                        version: (!version.is_null()).then(|| ((*version).major, (*version).minor)),
                    }
                }
                unsafe_sys::YAML_DOCUMENT_END_EVENT => Event::DocumentEnd,
                unsafe_sys::YAML_ALIAS_EVENT => Event::Alias {
                    anchor: owned(event.data.alias.anchor).unwrap_or_default(),
                },
                unsafe_sys::YAML_SCALAR_EVENT => {
                    let scalar = &event.data.scalar;
                    let length = usize::try_from(scalar.length).unwrap_or(0);
                    let value = if scalar.value.is_null() || length == 0 {
                        String::new()
                    } else {
                        String::from_utf8_lossy(std::slice::from_raw_parts(scalar.value, length))
                            .into_owned()
                    };
                    Event::Scalar {
                        anchor: owned(scalar.anchor),
                        tag: owned(scalar.tag).unwrap_or_default(),
                        value,
                        plain_implicit: scalar.plain_implicit,
                        double_quoted: scalar.style == unsafe_sys::YAML_DOUBLE_QUOTED_SCALAR_STYLE,
                        plain: scalar.style == unsafe_sys::YAML_PLAIN_SCALAR_STYLE,
                    }
                }
                unsafe_sys::YAML_SEQUENCE_START_EVENT => Event::SequenceStart {
                    anchor: owned(event.data.sequence_start.anchor),
                    flow: event.data.sequence_start.style == unsafe_sys::YAML_FLOW_SEQUENCE_STYLE,
                },
                unsafe_sys::YAML_MAPPING_START_EVENT => Event::MappingStart {
                    anchor: owned(event.data.mapping_start.anchor),
                    flow: event.data.mapping_start.style == unsafe_sys::YAML_FLOW_MAPPING_STYLE,
                },
                unsafe_sys::YAML_SEQUENCE_END_EVENT | unsafe_sys::YAML_MAPPING_END_EVENT => {
                    Event::CollectionEnd
                }
                _ => Event::Other,
            }
        };
        let marks = (mark(event.start_mark), mark(event.end_mark));
        // SAFETY: the event was initialised by the parser and is deleted once.
        unsafe { unsafe_sys::yaml_event_delete(event) };
        Ok((converted, marks.0, marks.1))
    }
}

impl Drop for Parser {
    fn drop(&mut self) {
        // SAFETY: `self.raw` came from `Box::into_raw` in `new` and was initialised there;
        // `yaml_parser_delete` frees what libyaml allocated, then the box is freed once.
        unsafe {
            unsafe_sys::yaml_parser_delete(self.raw.as_ptr());
            drop(Box::from_raw(self.raw.as_ptr()));
        }
    }
}
