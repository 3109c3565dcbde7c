//! The sink the pickle and JSON decoders stream a snapshot's trace to: trace-entry dicts become
//! [`TraceEntry`]s and frames lists go to the interning [`Pipeline`] as they are decoded.

use rustc_hash::FxHashMap;

use super::{Streamed, TRACE_KEYS};
use crate::options::DecodeOptions;
use crate::pickle::{self, Tree, Val};
use crate::torch::intern::{Interner, Pipeline, THREAD_FROM};
use crate::torch::model::{Action, StackId, TraceEntry};

/// The sink the decoders stream a snapshot's trace to (`runs`: with the run cache).
pub(super) fn trace_sink<'m>(
    bytes: &[u8],
    opts: &DecodeOptions,
    map: Option<&'m memmap2::Mmap>,
    runs: bool,
) -> TraceSink<'m> {
    let threaded = bytes.len() >= THREAD_FROM
        && std::thread::available_parallelism().is_ok_and(|n| n.get() > 1);
    #[cfg(test)]
    let threaded = threaded && !super::tests::INLINE.with(|c| c.get());
    TraceSink {
        interner: Interner::default(),
        pipeline: Some(Pipeline::new(
            threaded,
            opts.max_trace_events,
            // At most one trace entry per 24 bytes: the smallest entry torch writes (action,
            // addr, size, stream and an empty frames list as memo references) takes more. The
            // shared-lists shape has 60 bytes an entry, the realistic one 157. Under a cap on
            // the address space, a likelier count (growing past it copies).
            if crate::process_memory::address_space_limited() {
                bytes.len() / 64
            } else {
                bytes.len() / 24
            },
            runs,
        )),
        list_by_val: FxHashMap::default(),
        last_keys: Vec::new(),
        gather: [usize::MAX; 7],
        actions: Vec::new(),
        map,
        pager: map
            .filter(|_| threaded)
            .and_then(super::pager::Pager::start),
        released: 0,
        contexts: Default::default(),
        cancel: opts.cancel.clone(),
        progress: opts.progress.clone(),
    }
}

/// Converts trace-entry dicts to [`TraceEntry`]s while the pickle is decoded, so millions of
/// entries never sit in the object graph.
pub(super) struct TraceSink<'m> {
    pub(super) interner: Interner,
    /// Interns frames lists and stores the entries (on a worker thread for large files).
    pipeline: Option<Pipeline>,
    /// List number of frames lists that are not sunk (`None`: empty), by object.
    list_by_val: FxHashMap<Val, Option<u32>>,
    /// Key objects of the previous entry.
    last_keys: Vec<Val>,
    /// For each field of [`TRACE_KEYS`], where among the items its value is (after the last
    /// key that names it; `usize::MAX`, past any slice, where no key does): an entry with the
    /// same keys reads its fields from there.
    gather: [usize; 7],
    /// Action str object → action, for the last few action objects seen.
    actions: Vec<(Val, Action)>,
    map: Option<&'m memmap2::Mmap>,
    /// `compile_context` of the entries (`load/compile_context.rs`).
    pub(super) contexts: super::compile_context::Contexts,
    cancel: crate::options::Cancel,
    progress: crate::options::Progress,
    /// Maps the input in ahead of the decoder and gives it back behind, on its own thread.
    pager: Option<super::pager::Pager>,
    /// Without a pager: input bytes before this offset were given back to the kernel.
    released: usize,
}

impl TraceSink<'_> {
    /// Wait for the pipeline: the device trace lists, with stack ids.
    pub(super) fn finish(&mut self) -> Result<Streamed, String> {
        let Some(pipeline) = self.pipeline.take() else {
            return Ok(None);
        };
        let (table, traces) = pipeline.finish()?;
        self.interner.table = table;
        Ok((!traces.is_empty()).then_some(traces))
    }

    /// The list number of an entry's `frames` value.
    fn frames_list(&mut self, t: &Tree<'_>, fr: Val) -> Result<Option<u32>, String> {
        if let Some(k) = t.sunk(fr) {
            return Ok(Some(k));
        }
        if let Some(&k) = self.list_by_val.get(&fr) {
            return Ok(k);
        }
        let items = t.items(fr);
        let k = if items.is_empty() {
            if !t.is_seq(fr) {
                return Err(format!(
                    "a `frames` value is {}, expected a list",
                    t.describe(fr)
                ));
            }
            None
        } else {
            let p = self.pipeline.as_mut().ok_or("decoding already finished")?;
            let k = p.new_list()?;
            p.list(t, &mut self.interner, k, items)?;
            Some(k)
        };
        self.list_by_val.insert(fr, k);
        Ok(k)
    }
}

impl pickle::Sink for TraceSink<'_> {
    fn key(&self) -> &str {
        "device_traces"
    }

    fn entry(&mut self, t: &Tree<'_>, list: u32, pairs: &[Val]) -> Result<(), String> {
        // Every entry of a snapshot has the same key objects in the same order: map them once.
        let same_keys = super::compile_context::same_keys(pairs, &self.last_keys);
        if !same_keys {
            self.last_keys.clear();
            self.gather = [usize::MAX; 7];
            for (i, p) in pairs.chunks_exact(2).enumerate() {
                if let Some(slot) = t
                    .str(p[0])
                    .and_then(|name| TRACE_KEYS.iter().position(|w| *w == name))
                {
                    // A key named twice: its last value, as a dict keeps.
                    self.gather[slot] = 2 * i + 1;
                }
                self.last_keys.push(p[0]);
            }
        }
        // Read, not scattered: a store per key at a position known only at run time kept the
        // fields out of registers.
        let fields = self.gather.map(|at| pairs.get(at).copied());
        let action = match fields[0] {
            // Snapshots memoize the few action strings: remember the last ones by object.
            Some(a) => match self.actions.iter().find(|(v, _)| *v == a) {
                Some(&(_, act)) => act,
                None => {
                    let act = self.interner.action(t.str(a).unwrap_or("<not a str>"));
                    if self.actions.len() >= 16 {
                        self.actions.remove(0);
                    }
                    self.actions.push((a, act));
                    act
                }
            },
            None => self.interner.action("<missing>"),
        };
        // Until `finish`, `stack` holds the frames list number.
        let stack = match fields[6] {
            Some(fr) => self.frames_list(t, fr)?,
            None => None,
        };
        let entry = trace_entry(t, action, fields, stack);
        // The contexts saw every entry the sink did: the same keys for them as for it.
        self.contexts.note(t, list, pairs, same_keys);
        self.pipeline
            .as_mut()
            .ok_or("decoding already finished")?
            .entry(list, entry)
    }

    fn takes_sequences(&self) -> bool {
        true
    }

    fn new_sequence(&mut self) -> Result<u32, String> {
        self.pipeline
            .as_mut()
            .ok_or("decoding already finished")?
            .new_list()
    }

    fn sequence_run(&mut self, seq: u32, raw: &[u8], generation: u64) -> Result<bool, String> {
        let p = self.pipeline.as_mut().ok_or("decoding already finished")?;
        Ok(p.known_run(seq, raw, generation))
    }

    fn sequence_run_at(
        &mut self,
        seq: u32,
        rest: &[u8],
        generation: u64,
    ) -> Result<Option<usize>, String> {
        let p = self.pipeline.as_mut().ok_or("decoding already finished")?;
        Ok(p.known_run_at(seq, rest, generation))
    }

    fn sequence_dict(
        &mut self,
        t: &Tree<'_>,
        prev: Option<u32>,
        pairs: &[Val],
    ) -> Result<u32, String> {
        self.interner.frame_of_pairs(t, prev, pairs)
    }

    fn sequence(&mut self, t: &Tree<'_>, seq: u32, items: &[Val]) -> Result<(), String> {
        let p = self.pipeline.as_mut().ok_or("decoding already finished")?;
        p.list(t, &mut self.interner, seq, items)
    }

    fn progress(&mut self, offset: usize) -> bool {
        if self.cancel.is_cancelled() {
            return false;
        }
        self.progress.advance(offset as u64);
        // Give back the pages of input already decoded: the strings kept point into the map and
        // are re-read from the page cache if needed, so peak memory stays near the model's size.
        match (&self.pager, self.map) {
            (Some(pager), _) => pager.advance(offset),
            (None, Some(map)) => super::pager::give_back(map, offset, &mut self.released),
            (None, None) => {}
        }
        true
    }
}

/// One trace entry from its field values (in `TRACE_KEYS` order; the action already parsed).
fn trace_entry(
    t: &Tree<'_>,
    action: Action,
    f: [Option<Val>; 7],
    stack: Option<StackId>,
) -> TraceEntry {
    let [_, addr, size, stream, time_us, device_free, _] = f;
    let uint = |v: Option<Val>| {
        v.and_then(|v| t.int128(v))
            .map_or(0, |i| u64::try_from(i.max(0)).unwrap_or(u64::MAX))
    };
    TraceEntry::new(action, uint(addr), uint(size), uint(stream))
        .with_time_us(
            time_us
                .and_then(|v| t.int128(v))
                .map(|i| i.clamp(i64::MIN as i128, i64::MAX as i128) as i64),
        )
        .with_device_free(device_free.map(|v| uint(Some(v))))
        .with_stack(stack)
}
