//! Locate: capture paths → workspace files, the user-frame rule, fix edits.

pub mod edits;
pub mod frames;
pub mod paths;
pub mod workspace;
