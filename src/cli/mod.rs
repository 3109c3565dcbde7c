//! Command-line front ends: `report` and `--check`.
