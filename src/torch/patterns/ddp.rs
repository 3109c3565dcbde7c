//! PT006: the same parameters replicated on several devices.

use super::*;

/// PT006: DDP keeps full gradient buckets next to full parameters on each rank.
pub(super) fn ddp_replication(snap: &Snapshot, a: &Analysis, out: &mut Vec<Finding>) {
    let allocated = a.totals.overall.allocated;
    let comm = a.sites.role_total(Role::CommunicationBuffer);
    if comm == 0 || allocated == 0 || comm.saturating_mul(20) < allocated {
        return;
    }
    let params = a.sites.role_total(Role::Parameter);
    let opt = a.sites.role_total(Role::OptimizerState);
    let grads = a.sites.role_total(Role::Backward);
    let model_state = comm
        .saturating_add(params)
        .saturating_add(opt)
        .saturating_add(grads);
    if model_state.saturating_mul(2) < allocated {
        return;
    }
    let Some(site) = a
        .sites
        .sites
        .iter()
        .find(|s| s.role() == Role::CommunicationBuffer)
    else {
        return;
    };
    let (loc, stack) = culprit(snap, site.key, site.stack);
    let severity = if any_oom(a) {
        Severity::Warning
    } else {
        Severity::Information
    };
    let f = Finding::new(Code::PT006,
        severity,
        format!(
            "DDP keeps a full replica on this rank: {} of gradient buckets next to {} of parameters \
             and {} of optimizer state ({} of live memory).",
            fmt_bytes(comm),
            fmt_bytes(params),
            fmt_bytes(opt),
            pct_text(percent(model_state, allocated)),
        ),
    )
    .at(loc, stack)
    .bytes(model_state, percent(model_state, allocated), Label::Inferred)
    .evidence(Evidence::measured(format!(
        "{} live in blocks allocated under torch.distributed / DDP's reducer",
        fmt_bytes(comm)
    )))
    .evidence(Evidence::measured(format!(
        "parameters {} · optimizer state {} · backward buffers {} (role guessed from stacks)",
        fmt_bytes(params),
        fmt_bytes(opt),
        fmt_bytes(grads)
    )))
    .evidence(Evidence::inferred(
        "every DDP rank holds the same full-size parameters, gradients and optimizer state",
    ))
    .fix(Fix::advice(
        "Shard model state: FSDP (`torch.distributed.fsdp.fully_shard`) or ZeRO \
         (`ZeroRedundancyOptimizer`) keep about 1/world_size of it per rank",
    ));
    out.push(f);
}
