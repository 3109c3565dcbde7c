//! A safe pickle VM: decodes data, never executes anything.
