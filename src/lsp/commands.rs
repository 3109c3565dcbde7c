//! The names of the `workspace/executeCommand` commands, in one place: the server offers and
//! dispatches them (`server`), the handlers put them into code actions and lenses (`handlers/`).
//! Both import this module; neither imports the other for a name.

/// Forget the cache and read every capture again.
pub const REANALYZE: &str = "memlsp.reanalyze";
/// Show an advice fix's title and link (the command of a code action without an edit).
pub const EXPLAIN: &str = "memlsp.explain";
/// The HTML timeline page of one capture.
pub const TIMELINE: &str = "memlsp.timeline";
/// The client-side command a code lens runs (registered by the editor integrations, not offered
/// by the server): it asks the server for the page with `TIMELINE` and shows it.
pub const SHOW_TIMELINE: &str = "memlsp.showTimeline";

/// The commands the server executes (its `executeCommandProvider`).
pub const OFFERED: [&str; 3] = [REANALYZE, EXPLAIN, TIMELINE];
