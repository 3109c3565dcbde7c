//! The streaming interface of the VM: a caller receives designated dicts and lists as they are
//! decoded, instead of finding them in the tree afterwards.

use super::value::{Tree, Val};

/// Receives the dict items of designated lists while they are decoded, so a caller can turn
/// millions of small dicts into its own compact records instead of keeping them in the tree.
///
/// A list is streamed when it is an item of a list that is the value of the dict key
/// [`Sink::key`] — for a PyTorch snapshot, each per-device list of `device_traces`. Streamed
/// lists become `Node::StreamedList` (a count), their dicts `Node::Consumed`.
pub trait Sink {
    /// The dict key whose value is a list of lists to stream.
    fn key(&self) -> &str;
    /// One dict of streamed list number `list` (numbered in creation order), as its items in
    /// order: `[key, value, key, value, …]`. An `Err` stops decoding with that message at the
    /// current offset.
    fn entry(&mut self, tree: &Tree<'_>, list: u32, pairs: &[Val]) -> Result<(), String>;
    /// `offset` bytes of input are consumed (called every few MiB), e.g. to release pages.
    /// `false` stops decoding with [`crate::pickle::PickleErrorKind::Cancelled`].
    fn progress(&mut self, _offset: usize) -> bool {
        true
    }
    /// Whether lists that are values of streamed dicts go to [`Sink::sequence`] instead of the
    /// tree (a snapshot's frames lists: one fresh list of 30–120 frames per trace entry, which
    /// would otherwise be most of the decoded graph).
    fn takes_sequences(&self) -> bool {
        false
    }
    /// A new such list: its sequence number (below `u32::MAX`), which the list's value carries
    /// ([`Tree::sunk`]) wherever it is referenced.
    fn new_sequence(&mut self) -> Result<u32, String> {
        Err("this sink does not take lists".into())
    }
    /// Sequence `seq`, still empty, is about to receive exactly the items of `raw`: a run of
    /// fewer than 1000 `BINGET`/`LONG_BINGET` opcodes (with their memo indices) ending at an
    /// `APPENDS`. While `generation` is unchanged no memo slot was overwritten, so equal bytes
    /// mean equal items: a sink that saw the same run before may fill the sequence from it and
    /// return `true`, and the VM skips the run; with `false` the items follow as usual.
    fn sequence_run(&mut self, _seq: u32, _raw: &[u8], _generation: u64) -> Result<bool, String> {
        Ok(false)
    }
    /// Asked before [`Sink::sequence_run`], at the same place, with `rest`: the input from the
    /// run's first opcode to the end. A sink that took a run through `sequence_run` under the
    /// same `generation` and finds `rest` starting with exactly its bytes followed by an
    /// `APPENDS` may fill `seq` from it and return the run's length in bytes (the VM skips the
    /// run and that `APPENDS`); `None`, and the VM scans the run and asks `sequence_run`.
    fn sequence_run_at(
        &mut self,
        _seq: u32,
        _rest: &[u8],
        _generation: u64,
    ) -> Result<Option<usize>, String> {
        Ok(None)
    }
    /// A fresh dict that is an item of a sunk list (a frame of a frames list, when frame dicts
    /// are not shared), as its items `[key, value, …]`; `prev`: the number it got for its
    /// earlier items when they come in several batches. Returns the number that stands for it
    /// from then on ([`Tree::sunk_dict`]), in the sequences and wherever else it is referenced:
    /// such a dict never becomes an arena node. An empty dict arrives with no items.
    fn sequence_dict(
        &mut self,
        _tree: &Tree<'_>,
        _prev: Option<u32>,
        _pairs: &[Val],
    ) -> Result<u32, String> {
        Err("this sink does not take dicts".into())
    }
    /// Items appended to sequence `seq` (lists over 1000 items arrive in several batches).
    fn sequence(&mut self, _tree: &Tree<'_>, _seq: u32, _items: &[Val]) -> Result<(), String> {
        Err("this sink does not take lists".into())
    }
}
