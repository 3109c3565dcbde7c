//! Rules of the allocator on small hand-made traces.

use super::*;
