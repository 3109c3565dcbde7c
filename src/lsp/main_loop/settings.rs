//! The owner's settings: pulled from the client or pushed by it, applied (globs, options,
//! the baseline file), and the workspace index rebuilt for them.

use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;
use tower_lsp_server::ls_types as lsp;

use super::{Event, Owner, Status};
use crate::baseline::CompareOptions;
use crate::lsp::config::Settings;
use crate::lsp::workspace::CaptureMatcher;
use crate::source::paths::Resolver;

impl Owner {
    /// Ask the client for the `memlsp` section (in a task: the owner never waits on the client).
    /// The first pull always answers, with `null` when the client does not.
    pub(super) fn pull_settings(&self, first: bool) {
        if !self.caps().configuration {
            return;
        }
        let client = self.client.clone();
        let tx = self.tx.clone();
        tokio::spawn(async move {
            let item = lsp::ConfigurationItem {
                scope_uri: None,
                section: Some("memlsp".into()),
            };
            let res =
                tokio::time::timeout(Duration::from_secs(5), client.configuration(vec![item]));
            let value = match res.await {
                Ok(Ok(mut values)) => values.pop().unwrap_or(Value::Null),
                _ => Value::Null,
            };
            if first || !value.is_null() {
                let _ = tx.send(Event::Settings { value, first });
            }
        });
    }

    pub(super) async fn apply_settings(&mut self, v: &Value) {
        let (settings, problems) = Settings::from_json(v);
        for p in problems {
            self.log(lsp::MessageType::WARNING, format!("settings: {p}"))
                .await;
        }
        let first = self.resolver_gen == 0;
        if !first && settings == self.settings {
            return;
        }
        let options_changed = settings.options_key() != self.settings.options_key();
        let globs_changed = settings.capture_globs != self.settings.capture_globs;
        self.settings = settings;
        if globs_changed && self.registered {
            self.register_watchers(true);
        }
        let (matcher, bad) = CaptureMatcher::new(&self.roots, &self.settings.capture_globs);
        for b in bad {
            self.log(lsp::MessageType::WARNING, format!("captureGlobs: {b}"))
                .await;
        }
        self.matcher = matcher;
        // Captures that no longer match the globs are dropped.
        let before = self.captures.len();
        let m = &self.matcher;
        self.captures.retain(|p, _| m.is_capture(p));
        if options_changed {
            for e in self.captures.values_mut() {
                e.key = None;
                e.status = Status::New;
            }
        }
        self.store_view(None);
        self.rebuild_resolver();
        self.rescan();
        let baseline_changed = self.load_baseline().await;
        if before != self.captures.len() || baseline_changed {
            self.republish().await;
        }
    }

    /// Read the `baseline` setting's file again. True when what the captures are compared with
    /// changed. A file that cannot be read is reported once and compares nothing.
    pub(super) async fn load_baseline(&mut self) -> bool {
        self.baseline_path = self.settings.baseline_path(&self.roots);
        let loaded = match &self.baseline_path {
            None => None,
            Some(p) => match std::fs::read_to_string(p)
                .map_err(|e| format!("{}: cannot read the baseline ({e})", p.display()))
                .and_then(|t| crate::baseline::parse(p, &t))
            {
                Ok(b) => Some(Arc::new((
                    b,
                    CompareOptions {
                        max_growth: self.settings.baseline_max_growth / 100.0,
                        timing: self.settings.baseline_timing,
                    },
                ))),
                Err(e) => {
                    self.log(lsp::MessageType::ERROR, format!("baseline: {e}"))
                        .await;
                    self.client
                        .show_message(lsp::MessageType::WARNING, format!("memlsp: {e}"))
                        .await;
                    None
                }
            },
        };
        let changed = loaded != self.baseline;
        self.baseline = loaded;
        changed
    }

    pub(super) fn rebuild_resolver(&mut self) {
        self.resolver_gen += 1;
        let generation = self.resolver_gen;
        let roots = self.roots.clone();
        let mappings = self.settings.mappings(&roots);
        let tx = self.tx.clone();
        tokio::spawn(async move {
            let built =
                tokio::task::spawn_blocking(move || Arc::new(Resolver::new(roots, mappings))).await;
            match built {
                Ok(r) => {
                    let _ = tx.send(Event::ResolverReady(generation, r));
                }
                Err(e) => eprintln!("memlsp: indexing the workspace failed: {e}"),
            }
        });
    }
}
