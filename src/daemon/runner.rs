//! Placeholder: the session process runner.
