//! Integration tests of `VRAMSHIM_POOL=stitch` on cuda-sim (real processes under the preload):
//! the log-replay workload with pattern checking on every shipped trace, a device too small
//! for the driver alone, delayed stream "kernels" writing into freed blocks (and the forced
//! early-reuse variant proving the test can fail, also through the per-thread caches), the
//! thread caches' blocks serving another thread under the cap, and injected driver faults;
//! and, in process, a fork while a thread reads the pool's budget.

use std::path::PathBuf;
use vramshim_testkit::{
    Link, RunOutput, compile_c, interposer_lib, replay_exe, run_with_preload, trace_file,
};

/// `tests/workloads/pool/<name>.c`, built against the shared runtime.
fn workload(name: &str) -> PathBuf {
    let src = format!("tests/workloads/pool/{name}.c");
    compile_c(
        &format!("pool_{name}"),
        &[src.as_str()],
        Link::SharedRuntime,
    )
}

fn run(exe: &std::path::Path, args: &[&str], env: &[(&str, &str)], name: &str) -> RunOutput {
    run_with_preload(exe, args, env, Some(&interposer_lib()), name)
}

/// The integer after the last `key=` in `out` where `key` is a whole key: not the end of a
/// longer one (`pages=` inside `most_pages=`, `live=` inside `recent_peak_live=`).
fn field(out: &str, key: &str) -> i64 {
    let word = |c: char| c.is_ascii_alphanumeric() || c == '_';
    assert!(
        !key.is_empty() && key.chars().all(word),
        "field: {key:?} is not a key"
    );
    let k = format!("{key}=");
    let (i, _) = out
        .match_indices(&k)
        .filter(|&(i, _)| !out[..i].ends_with(word))
        .last()
        .unwrap_or_else(|| panic!("no {key}= in {out}"));
    out[i + k.len()..]
        .split(|c: char| !(c.is_ascii_digit() || c == '-'))
        .next()
        .unwrap()
        .parse()
        .unwrap()
}

/// `field` reads whole keys: a key that ends a longer one (`pages` of `most_pages`, `n` of
/// `unknown`) is not read there, wherever the longer one stands.
#[test]
fn field_reads_whole_keys_only() {
    let out = "busy_maps pages=5 most_pages=7\npool_stats n=2 live=3 recent_peak_live=9 unknown=-1";
    assert_eq!(field(out, "pages"), 5);
    assert_eq!(field(out, "most_pages"), 7);
    assert_eq!(field(out, "n"), 2);
    assert_eq!(field(out, "live"), 3);
    assert_eq!(field(out, "recent_peak_live"), 9);
    assert_eq!(field(out, "unknown"), -1);
}

#[test]
fn replays_every_trace_with_patterns_through_the_pool() {
    let exe = replay_exe();
    for t in [
        "vit_train.rmm.csv",
        "bert_serve.rmm.csv",
        "t5_train.rmm.csv",
    ] {
        let trace = trace_file(t);
        let trace = trace.to_str().unwrap();
        for mode in [None, Some("--async")] {
            let mut args = vec!["--pattern", "memcpy"];
            args.extend(mode);
            args.push(trace);
            let o = run(
                &exe,
                &args,
                &[("VRAMSHIM_POOL", "stitch"), ("VRAMSHIM_LOG", "debug")],
                "pool-replay",
            );
            assert_exit(&o, 0, &format!("{t} {mode:?}"));
            assert_eq!(field(&o.stdout, "mismatches"), 0, "{t}");
            assert_eq!(field(&o.stdout, "failed"), 0, "{t}");
            let pooled = o.stderr.lines().filter(|l| l.ends_with("[pool]")).count() as i64;
            assert_eq!(
                pooled,
                2 * field(&o.stdout, "allocs"),
                "{t}: every alloc and free pooled"
            );
        }
    }
}

fn tail(s: &str) -> String {
    let v: Vec<&str> = s.lines().collect();
    v[v.len().saturating_sub(15)..].join("\n")
}

/// `vramshim summary ARGS TRACE`'s output (it must succeed).
fn summary(trace: &std::path::Path, args: &[&str]) -> String {
    let vramshim = vramshim_testkit::vramshim_exe();
    let out = std::process::Command::new(&vramshim)
        .arg("summary")
        .args(args)
        .arg(trace)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "{text}");
    text
}

/// The run ended with `code`; else its output (stdout, the end of stderr), after `what`.
#[track_caller]
fn assert_exit(o: &RunOutput, code: i32, what: &str) {
    assert_eq!(
        o.code(),
        Some(code),
        "{what}: {}\n{}",
        o.stdout,
        tail(&o.stderr)
    );
}

#[test]
fn pool_fits_where_the_driver_alone_does_not() {
    let exe = replay_exe();
    let trace = trace_file("vit_train.rmm.csv");
    let trace = trace.to_str().unwrap();
    // peak live 160.5 MiB: the driver alone (sub-page packing, whole pages above) needs
    // about 260 MiB on cuda-sim; the pool needs 172 MiB
    let env = |pool| {
        vec![
            ("VRAMSIM_MEMORY", "180MiB"),
            ("VRAMSIM_CONTEXT_OVERHEAD", "0"),
            ("VRAMSHIM_POOL", pool),
        ]
    };
    let o = run(&exe, &["--quiet", trace], &env("stitch"), "pool-tight");
    assert_exit(&o, 0, "");
    let o = run(&exe, &["--quiet", trace], &env("off"), "pool-tight-off");
    assert_eq!(o.code(), Some(2), "{}", o.stdout);
    assert!(field(&o.stdout, "failed") > 0);
}

#[test]
fn delayed_kernels_never_write_into_a_reused_block() {
    let exe = workload("early_reuse");
    // the workload in `mode` under the pool with `budget`, `extra` its optional arguments
    let early = |mode: &str, budget: &str, extra: &[&str], debug: Option<&str>| {
        let mut args = vec![mode, "3"];
        args.extend(extra);
        let mut env = vec![
            ("VRAMSHIM_POOL", "stitch"),
            ("VRAMSHIM_POOL_BUDGET", budget),
        ];
        env.extend(debug.map(|d| ("VRAMSHIM_POOL_DEBUG", d)));
        run(&exe, &args, &env, "pool-early")
    };
    for mode in ["async", "sync"] {
        // with the budget (alone, and with a block live throughout, which keeps freed blocks
        // in the threads' caches), and without; stream-ordered also after a loop of each
        // size of a page or more (whose frees the caches then keep too)
        let mut cases: Vec<(&str, &[&str])> = vec![("5%", &[]), ("5%", &["anchor"]), ("off", &[])];
        if mode == "async" {
            cases.push(("5%", &["anchor", "loop"]));
        }
        for (budget, extra) in cases {
            let o = early(mode, budget, extra, None);
            assert_exit(&o, 0, &format!("{mode} budget {budget} {extra:?}"));
            assert_eq!(field(&o.stdout, "foreign"), 0);
            if mode == "async" {
                // cross-stream reuse happens (behind an event), without a foreign byte
                assert!(field(&o.stdout, "same_address") > 0, "{}", o.stdout);
            }
        }
        // the same workload with reuse forced early does see foreign bytes: the test can fail
        let o = run(
            &exe,
            &[mode, "3"],
            &[
                ("VRAMSHIM_POOL", "stitch"),
                ("VRAMSHIM_POOL_DEBUG", "reuse-early"),
            ],
            "pool-early-forced",
        );
        assert_exit(&o, 1, &format!("{mode} forced"));
        assert!(field(&o.stdout, "foreign") > 0);
        if mode == "async" {
            // and so does a thread cache that hands a block freed on one stream to a
            // request on another without ordering: the thread caches keep stream order.
            // With the budget only while another block is live: where the freed block is all
            // the pool has live, the cache gives it back at once (a round end, see `tcache`)
            // and the pool, not the cache, serves the other stream's request. After a loop
            // of each large size the caches keep its frees (`Policy::aside_run`): the large
            // blocks alone are reused early there, which the caches keeping no large free
            // (`tcache-no-run`) never do.
            let any: &[(&str, &[&str])] = &[
                ("5%", &["anchor"]),
                ("off", &[]),
                ("5%", &["anchor", "loop"]),
            ];
            for &(budget, extra) in any {
                let o = early(mode, budget, extra, Some("tcache-any-stream"));
                assert_exit(
                    &o,
                    1,
                    &format!("tcache-any-stream, budget {budget} {extra:?}"),
                );
                assert!(field(&o.stdout, "foreign") > 0);
            }
            let o = early(
                mode,
                "5%",
                &["anchor", "loop"],
                Some("tcache-any-stream,tcache-no-run"),
            );
            assert_exit(&o, 0, "tcache-any-stream,tcache-no-run after loops");
            assert_eq!(field(&o.stdout, "foreign"), 0);
        }
    }
}

/// A block freed stream-ordered on a stream the program then destroys, while a delayed
/// "kernel" still writes into it, never reaches the stream created next (cuda-sim gives it the
/// destroyed one's handle value) before that kernel is done: through each destroy entry point
/// (the runtime's, the driver's by `dlsym`, the driver's through `cudaGetDriverEntryPoint`),
/// with and without the budget, through the pool and through the thread caches (a block live
/// throughout keeps the frees there). With the pool's notice ignored (`ignore-retired`), or the
/// thread caches keeping their frees across the destroy (`tcache-keep-retired`), the late write
/// lands in the new stream's block: the test can fail.
#[test]
fn a_destroyed_stream_s_handle_never_gets_its_freed_blocks_early() {
    let exe = workload("stream_retire");
    let go = |mode: &str, budget: &str, extra: Option<&str>, debug: Option<&str>| {
        let mut args = vec![mode, "2"];
        args.extend(extra);
        let mut env = vec![
            ("VRAMSHIM_POOL", "stitch"),
            ("VRAMSHIM_POOL_BUDGET", budget),
        ];
        env.extend(debug.map(|d| ("VRAMSHIM_POOL_DEBUG", d)));
        run(&exe, &args, &env, "pool-retire")
    };
    for mode in ["runtime", "driver", "lookup"] {
        for (budget, extra) in [("5%", None), ("5%", Some("anchor")), ("off", None)] {
            let what = format!("{mode} budget {budget} {extra:?}");
            let o = go(mode, budget, extra, None);
            assert_exit(&o, 0, &what);
            assert_eq!(field(&o.stdout, "foreign"), 0, "{what}");
            // every new stream got the destroyed one's handle, and its block back behind
            // the event recorded before the destroy
            assert_eq!(
                field(&o.stdout, "same_handle"),
                field(&o.stdout, "blocks"),
                "{what}"
            );
            assert!(field(&o.stdout, "same_address") > 0, "{what}: {}", o.stdout);
        }
    }
    for (extra, debug) in [
        (None, "ignore-retired"),
        (Some("anchor"), "ignore-retired"),
        (Some("anchor"), "tcache-keep-retired"),
    ] {
        let o = go("runtime", "5%", extra, Some(debug));
        assert_exit(&o, 1, &format!("{debug} {extra:?}"));
        assert!(field(&o.stdout, "foreign") > 0, "{debug}");
    }
}

/// A traced program's allocation stream as `vramshim replay` reads it (successful device
/// allocations and frees, process device syncs, stream destroys as retirements), and how many
/// stream destroys the trace holds. `retire`: false drops the retirements, as a trace written
/// before `StreamDestroy` records existed reads.
fn replay_ops(trace: &std::path::Path, retire: bool) -> (Vec<vramshim_pool::replay::Event>, usize) {
    use vramshim_pool::replay::Event as Op;
    use vramshim_pool::{ANY_STREAM, FreeMode};
    use vramshim_trace::{Api, Event, SyncKind, flags};
    let key = |m: &vramshim_trace::MemOp| {
        vramshim_pool::streams::ordered_on(
            m.stream,
            m.flags & flags::PER_THREAD_STREAM != 0,
            || m.tid,
        )
    };
    let mut r = vramshim_trace::TraceReader::open(trace).unwrap();
    let mut e = Event::Lost { t_ns: 0, count: 0 };
    let (mut ops, mut destroys) = (Vec::new(), 0);
    while r.next_into(&mut e).unwrap() {
        match &e {
            Event::Alloc(m) if m.kind.is_device() && m.result == 0 && m.addr != 0 => {
                let stream = match m.api {
                    Api::CudaMallocAsync | Api::CuMemAllocAsync => key(m),
                    _ => ANY_STREAM,
                };
                ops.push(Op::Alloc {
                    id: m.addr,
                    size: m.size,
                    stream,
                });
            }
            Event::Free(m) if m.kind.is_device() && m.result == 0 && m.addr != 0 => {
                let mode = match m.api {
                    Api::CudaFreeAsync | Api::CuMemFreeAsync => FreeMode::Async { stream: key(m) },
                    _ => FreeMode::Sync,
                };
                ops.push(Op::Free { id: m.addr, mode });
            }
            Event::Sync {
                kind: SyncKind::ProcessDevice,
                ..
            } => ops.push(Op::ProcessSync),
            Event::StreamDestroy { stream, .. } => {
                destroys += 1;
                if retire {
                    ops.push(Op::StreamRetired { stream: *stream });
                }
            }
            _ => {}
        }
    }
    (ops, destroys)
}

/// The early reuses the model's checker finds in `ops` replayed through the tight stitch pool
/// (`thread_caches` in front of it, as the live library's are on by default; `ignore_retired`
/// as `VRAMSHIM_POOL_DEBUG=ignore-retired`, under which the live caches are off).
fn model_early_reuses(
    ops: &[vramshim_pool::replay::Event],
    thread_caches: bool,
    ignore_retired: bool,
) -> usize {
    use vramshim_pool::replay;
    let mut dev = vramshim_pool::AccountingDevice::new(replay::UNLIMITED);
    dev.set_checking(true);
    let mut p = vramshim_pool::stitch::Stitch::tight().with_thread_caches(thread_caches);
    p.set_faults(vramshim_pool::stitch::Faults {
        ignore_retired,
        ..Default::default()
    });
    let r = replay::run_with(ops, &mut p, &mut dev);
    assert!(r.completed, "{:?}", r.first_failure);
    let early = r
        .violations
        .iter()
        .filter(|v| v.starts_with("early reuse"))
        .count();
    assert_eq!(early, r.violations.len(), "{:?}", r.violations);
    early
}

/// A traced program that destroys a stream while a late write of its own still runs, and gets
/// the handle value back for its next stream (`stream_retire`), records each destroy
/// (`StreamDestroy`), and its trace replayed through the model (the pool crate's tight stitch
/// pool on the checking accounting device, stream destroys as retirements, as `vramshim replay`
/// reads them) gives the live pool's answer: no early reuse where the live run counted no
/// foreign byte (the default pool), early reuses where it counted foreign bytes
/// (`ignore-retired`, the model with the same fault). Without the retirements (a trace as
/// written before the record) the model cannot tell the new stream from the old and finds no
/// early reuse under the fault either: the record is what carries the answer. `vramshim
/// replay` reads the default run's trace and makes the live pool's driver calls.
#[test]
fn a_traced_stream_destroy_replays_with_the_live_foreign_byte_answer() {
    let exe = workload("stream_retire");
    let dir = vramshim_testkit::temp_dir("pool_stream_destroy_trace");
    for (debug, thread_caches) in [(None, true), (Some("ignore-retired"), false)] {
        let trace = dir.join(format!("{}.vramtrace", debug.unwrap_or("default")));
        let _ = std::fs::remove_file(&trace);
        let mut env = vec![
            ("VRAMSHIM_POOL", "stitch"),
            ("VRAMSHIM_TRACE", trace.to_str().unwrap()),
            ("VRAMSIM_DEBUG", "1"),
        ];
        env.extend(debug.map(|d| ("VRAMSHIM_POOL_DEBUG", d)));
        let o = run(&exe, &["runtime", "2", "anchor"], &env, "pool-retire-trace");
        let foreign = field(&o.stdout, "foreign");
        assert_exit(
            &o,
            if debug.is_some() { 1 } else { 0 },
            &format!("{debug:?}"),
        );
        let (ops, destroys) = replay_ops(&trace, true);
        // two streams destroyed per block
        assert_eq!(destroys as i64, 2 * field(&o.stdout, "blocks"), "{debug:?}");
        let early = model_early_reuses(&ops, thread_caches, debug.is_some());
        eprintln!(
            "{debug:?}: live foreign bytes {foreign}, model early reuses {early} ({destroys} stream destroys)"
        );
        assert_eq!(
            foreign > 0,
            early > 0,
            "{debug:?}: live {foreign}, model {early}"
        );
        if debug.is_none() {
            // `vramshim replay` reads the trace (its stream destroys as retirements) and
            // predicts the live pool's driver calls
            let json = vramshim_replay_json(&trace, &[]);
            let policies = &json[json.find("\"policies\"").unwrap()..];
            assert_eq!(json_value(policies, "completed").as_deref(), Some("true"));
            let model_calls: u64 = json_value(policies, "driver_calls")
                .unwrap()
                .parse()
                .unwrap();
            assert_eq!(model_calls, sim_memory_calls(&o.stderr), "driver calls");
        } else {
            let (old, _) = replay_ops(&trace, false);
            assert_eq!(
                model_early_reuses(&old, thread_caches, true),
                0,
                "without the retirements the model still saw the early reuse"
            );
        }
    }
}

/// A stream capture on one thread stays valid while another thread allocates and frees
/// through the pool at sizes that make it reuse a cached block, order two streams and grow:
/// through each begin/end-capture entry point (the runtime's, the driver's by `dlsym`, the
/// driver's through `cudaGetDriverEntryPoint`, and capturing into an existing graph through
/// the runtime's and the driver's `BeginCaptureToGraph`), with and without the budget. The
/// pool serves every request, the one that must grow too, whatever the modes: the
/// virtual-memory calls it grows with are allowed during any capture and invalidate none
/// (tests/workloads/sim/driver_facts.expected), where the mode rules forbid the worker unsafe
/// calls (both in global mode, or the capturing thread itself) too. An end-capture call the
/// driver refuses (a null graph pointer) leaves the capture under way for the pool too
/// (`badend`). The worker's requests want no synchronization (for those that do:
/// `the_library_never_synchronizes_while_any_capture_is_under_way`). With the old refusal of
/// the virtual-memory calls while the mode rules forbid them (a temporary edit of
/// `CudaDevice::create`) the forbidden cases refuse the 64 MiB request: the test fails.
#[test]
fn a_capture_on_another_thread_survives_the_pool_s_calls() {
    let exe = workload("capture_threads");
    let go = |args: &[&str], budget: &str, debug: Option<&str>| {
        let mut env = vec![
            ("VRAMSHIM_POOL", "stitch"),
            ("VRAMSHIM_POOL_BUDGET", budget),
        ];
        env.extend(debug.map(|d| ("VRAMSHIM_POOL_DEBUG", d)));
        run(&exe, args, &env, "pool-capture")
    };
    for entry in ["runtime", "driver", "lookup", "tograph", "drivertograph"] {
        for budget in ["5%", "off"] {
            for (capture, worker, extra) in [
                // the mode rules forbid the worker unsafe calls
                ("global", "global", None),
                ("global", "global", Some("self")),
                ("local", "global", Some("self")),
                // an end the driver refuses leaves the capture going on
                ("global", "global", Some("badend")),
                // they forbid it none
                ("global", "local", None),
                ("global", "relaxed", None),
                ("local", "global", None),
                ("relaxed", "global", None),
                // the capturing stream blocking: no use of the legacy stream (which would
                // depend on it: cuda-sim answers 906 and invalidates the capture)
                ("global", "global", Some("blocking")),
                ("global", "relaxed", Some("blocking")),
                ("relaxed", "global", Some("blocking")),
                ("relaxed", "relaxed", Some("blocking")),
            ] {
                let mut args = vec![entry, capture, worker];
                args.extend(extra);
                let what = format!("{args:?} budget {budget}");
                let o = go(&args, budget, None);
                assert_exit(&o, 0, &what);
                assert_eq!(field(&o.stdout, "end"), 0, "{what}");
                assert_eq!(field(&o.stdout, "errors"), 0, "{what}");
                assert_eq!(field(&o.stdout, "refused"), 0, "{what}: {}", o.stdout);
                assert_eq!(field(&o.stdout, "served"), 4, "{what}: {}", o.stdout);
            }
        }
    }
}

/// The library never synchronizes the device while a capture is under way on another thread,
/// whatever the capture's mode and the thread's: the driver refuses a `cuCtxSynchronize`
/// during any capture of the context and invalidates it, relaxed and thread-local captures of
/// other threads included (tests/workloads/sim/driver_facts.expected, `ctx_sync`), though the
/// mode rules forbid the thread nothing. capture_sync: the main thread holds a capture
/// (relaxed, thread-local, global) while a worker (global, or relaxed beside the global
/// capture) makes the library want a synchronization: through the pool (`pool`: a 64 MiB
/// block cudaFree'd, then 64 MiB more: the pool grows instead, 0 synchronizations) and through
/// the cap's settling of the driver's pools (`settle`, a 48 MiB cap without the pool: the cap
/// refuses the worker's 40 MiB, 2, instead of emptying the pools; the same request succeeds
/// after the capture). The capture ends with a graph. With the synchronization decided by the
/// mode rules and the request's stream (`sync-by-mode`, the old rule) the pool and the cap
/// synchronize inside the capture and the faithful simulator invalidates it: end 901, no
/// graph, exit 1.
#[test]
fn the_library_never_synchronizes_while_any_capture_is_under_way() {
    let exe = workload("capture_sync");
    let go = |route: &str, capture: &str, worker: &str, debug: Option<&str>| {
        let mut env = if route == "pool" {
            vec![("VRAMSHIM_POOL", "stitch")]
        } else {
            vec![
                ("VRAMSHIM_CAP", "48MiB"),
                ("VRAMSHIM_CAP_CONTEXT", "exclude"),
                ("VRAMSIM_MEMORY", "1GiB"),
                ("VRAMSIM_CONTEXT_OVERHEAD", "0"),
            ]
        };
        env.extend(debug.map(|d| ("VRAMSHIM_POOL_DEBUG", d)));
        run(&exe, &[route, capture, worker], &env, "pool-capture-sync")
    };
    for (capture, worker) in [
        ("relaxed", "global"),
        ("local", "global"),
        ("global", "relaxed"),
    ] {
        for route in ["pool", "settle"] {
            let what = format!("{route} {capture} {worker}");
            let o = go(route, capture, worker, None);
            assert_exit(&o, 0, &what);
            assert_eq!(field(&o.stdout, "end"), 0, "{what}: {}", o.stdout);
            assert_eq!(field(&o.stdout, "graph"), 1, "{what}: {}", o.stdout);
            assert_eq!(field(&o.stdout, "after"), 0, "{what}: {}", o.stdout);
            if route == "pool" {
                // the pool grew instead
                assert_eq!(field(&o.stdout, "during"), 0, "{what}: {}", o.stdout);
                assert_eq!(field(&o.stdout, "syncs"), 0, "{what}: {}", o.stdout);
            } else {
                // cudaErrorMemoryAllocation: the cap could not empty the driver's pools
                assert_eq!(field(&o.stdout, "during"), 2, "{what}: {}", o.stdout);
            }
            let o = go(route, capture, worker, Some("sync-by-mode"));
            assert_exit(&o, 1, &format!("{what} sync-by-mode"));
            assert_eq!(field(&o.stdout, "end"), 901, "{what}: {}", o.stdout);
            assert_eq!(field(&o.stdout, "graph"), 0, "{what}: {}", o.stdout);
        }
    }
}

/// A request the pool could place only after a synchronization is served beside a capture
/// where the device has room: the pool grows for it (new pages of its own) instead of
/// refusing it. capture_sync `fenced`: the worker's 64 MiB `cudaMallocAsync` on its stream,
/// freed there, then a 64 MiB `cudaMalloc` (no stream: the freed bytes need a synchronization,
/// which no capture allows) while the main thread holds a capture (relaxed, thread-local,
/// global; the worker global, or relaxed beside the global one): the worker gets 0, no
/// synchronization by the pool, the capture ends with a graph. Under a cap that leaves no
/// room for the new pages (100 MiB: 64 MiB freed, the anchor's page, no context charged) the
/// request is refused, out of memory (2), the capture still valid; after the capture the same
/// request succeeds.
#[test]
fn a_request_that_needs_a_synchronization_grows_beside_a_capture() {
    let exe = workload("capture_sync");
    for (capture, worker) in [
        ("relaxed", "global"),
        ("local", "global"),
        ("global", "relaxed"),
    ] {
        for capped in [false, true] {
            let mut env = vec![("VRAMSHIM_POOL", "stitch")];
            if capped {
                env.extend([
                    ("VRAMSHIM_CAP", "100MiB"),
                    ("VRAMSHIM_CAP_CONTEXT", "exclude"),
                    ("VRAMSIM_MEMORY", "1GiB"),
                    ("VRAMSIM_CONTEXT_OVERHEAD", "0"),
                ]);
            }
            let o = run(
                &exe,
                &["fenced", capture, worker],
                &env,
                "pool-capture-fenced",
            );
            let what = format!("fenced {capture} {worker} capped={capped}");
            assert_exit(&o, 0, &what);
            let during = if capped { 2 } else { 0 };
            for (key, want) in [
                ("during", during),
                ("syncs", 0),
                ("end", 0),
                ("graph", 1),
                ("after", 0),
            ] {
                assert_eq!(field(&o.stdout, key), want, "{what} {key}: {}", o.stdout);
            }
        }
    }
}

/// Graph allocations through the pool: during a capture, a `cudaMallocAsync` on the capturing
/// stream goes to the driver, which makes it an allocation node of the graph, as without the
/// library: one for more than the pool holds succeeds, and one the pool could serve from what
/// it holds is not the pool's (the next request on the
/// stream after the capture does not get the bytes every launch writes); the graph launches
/// twice, the allocation is freed in the graph or outside it (`cudaFreeAsync`, `cudaFree`),
/// and no graph memory is left; global and thread-local captures, budget 5% and off. Under a
/// cap the 64 MiB request gets the out-of-memory code a capped allocation gets (2), the
/// capture left valid. With the old answers (`refuse-graph-allocs`: served from the pool, with
/// `graph-frees-reused`: taken back at the capture's free) the test fails.
#[test]
fn graph_allocations_go_to_the_driver_as_nodes_of_the_graph() {
    let exe = workload("capture_graph");
    let go = |args: &[&str], budget: &str, cap: bool, debug: Option<&str>| {
        let mut env = vec![
            ("VRAMSHIM_POOL", "stitch"),
            ("VRAMSHIM_POOL_BUDGET", budget),
            ("VRAMSHIM_LOG", "debug"),
        ];
        if cap {
            env.extend([
                ("VRAMSHIM_CAP", "48MiB"),
                ("VRAMSHIM_CAP_CONTEXT", "exclude"),
                ("VRAMSIM_MEMORY", "1GiB"),
                ("VRAMSIM_CONTEXT_OVERHEAD", "0"),
            ]);
        }
        env.extend(debug.map(|d| ("VRAMSHIM_POOL_DEBUG", d)));
        run(&exe, args, &env, "pool-capture-graph")
    };
    for budget in ["5%", "off"] {
        for mode in ["global", "local"] {
            for free in ["inside", "outside"] {
                let what = format!("{mode} {free} budget {budget}");
                let o = go(&[mode, free], budget, false, None);
                assert_exit(&o, 0, &what);
                assert_eq!(field(&o.stdout, "big"), 0, "{what}");
                assert_eq!(field(&o.stdout, "end"), 0, "{what}");
                assert_eq!(field(&o.stdout, "launches"), 0, "{what}");
                assert_eq!(field(&o.stdout, "reserved"), 0, "{what}");
                assert_eq!(field(&o.stdout, "overlap"), 0, "{what}");
                // the driver allocated both, the 4 MiB block the pool holds too
                for size in [4 << 20, 64 << 20] {
                    let line = format!("cudaMallocAsync size={size} ");
                    assert!(
                        o.stderr.lines().any(|l| l.contains(&line)
                            && l.contains("-> 0")
                            && l.ends_with("[real]")),
                        "{what}: {}",
                        tail(&o.stderr)
                    );
                }
                let o = go(&[mode, free, "capped"], budget, true, None);
                assert_exit(&o, 0, &format!("{what} capped"));
                assert_eq!(field(&o.stdout, "big"), 2, "{what} capped");
                assert_eq!(field(&o.stdout, "end"), 0, "{what} capped");
            }
        }
    }
    // the old answers: the pool serves the 4 MiB block from what it holds, and takes it back
    // at the capture's free: the next request on the stream gets the bytes every launch writes.
    // The test fails. The 64 MiB request the pool serves too, growing (its calls are allowed
    // during the capture), or the cap refuses it (2). (With `refuse-graph-allocs` alone the
    // blocks it serves are no graph allocations: their frees in the capture go to the driver,
    // which refuses them, and the blocks stay the program's: no overlap, the frees failed.)
    for args in [
        &["global", "inside"][..],
        &["global", "outside", "capped"][..],
    ] {
        let old = Some("refuse-graph-allocs,graph-frees-reused");
        let o = go(args, "5%", args.len() == 3, old);
        let big = if args.len() == 3 { 2 } else { 0 };
        assert_exit(&o, 1, &format!("{old:?} {args:?}"));
        assert_eq!(field(&o.stdout, "big"), big, "{}", o.stdout);
        assert_eq!(field(&o.stdout, "overlap"), 1, "{}", o.stdout);
        // the capture's frees of the pool's blocks fail (exit 2)
        let o = go(args, "5%", args.len() == 3, Some("refuse-graph-allocs"));
        assert_exit(&o, 2, &format!("refuse-graph-allocs {args:?}"));
        assert_eq!(field(&o.stdout, "big"), big, "{}", o.stdout);
        assert_eq!(field(&o.stdout, "overlap"), 0, "{}", o.stdout);
        assert_ne!(field(&o.stdout, "frees"), 0, "{}", o.stdout);
        assert_eq!(field(&o.stdout, "later"), 0, "{}", o.stdout);
    }
}

/// A pool block freed on a capturing stream: CUDA makes a stream-ordered free in a capture a
/// free node, which takes only a graph allocation's address, so it refuses the free of memory
/// allocated before the capture (`cudaErrorInvalidValue`; the real driver leaves the capture
/// valid: tests/workloads/sim/driver_facts.expected, `capture_free_stream_ordered`); through
/// the library the free of such a block goes to the driver, which answers it. capture_graph
/// `prefree` / `prefree-malloc`: a 4 MiB block the pool serves before the capture
/// (`cudaMallocAsync` / `cudaMalloc`) is freed on the capturing stream inside it. The codes
/// and the capture's status are those of the same program without the library on the same
/// simulated driver (the fidelity witness: the free 1, the capture still active (1), its
/// later requests and its end 0, as a real driver answers); the block stays the program's: 4 MiB requests
/// after the capture on that stream, on another and through `cudaMalloc` get other bytes,
/// its free after the capture succeeds, and the pool counts nothing as freed in a graph.
/// Global and thread-local captures, freed inside and outside, budget 5% and off. With the old
/// answer (`graph-frees-reused`: the pool takes the block back at the capture's free, which
/// succeeds) the next request on the stream gets its bytes: the test fails.
#[test]
fn a_pool_block_freed_in_a_capture_is_never_reused() {
    let exe = workload("capture_graph");
    let json = vramshim_testkit::temp_dir("pool_graph_free").join("stats.json");
    let go = |args: &[&str], budget: &str, debug: Option<&str>| {
        let _ = std::fs::remove_file(&json);
        let mut env = vec![
            ("VRAMSHIM_POOL", "stitch"),
            ("VRAMSHIM_POOL_BUDGET", budget),
            ("VRAMSHIM_LOG", "debug"),
            ("VRAMSHIM_STATS", json.to_str().unwrap()),
        ];
        env.extend(debug.map(|d| ("VRAMSHIM_POOL_DEBUG", d)));
        let o = run(&exe, args, &env, "pool-graph-free");
        (o, std::fs::read_to_string(&json).unwrap_or_default())
    };
    let codes = [
        "prefree", "status", "small", "big", "end", "frees", "later", "overlap", "launches",
    ];
    for mode in ["global", "local"] {
        for free in ["inside", "outside"] {
            for pre in ["prefree", "prefree-malloc"] {
                let args = [mode, free, pre];
                let plain = vramshim_testkit::run_with_preload(
                    &exe,
                    &args,
                    &[],
                    None,
                    "pool-graph-free-plain",
                );
                assert_exit(&plain, 0, &format!("{args:?} without the library"));
                // what CUDA answers, on cuda-sim
                // (tests/workloads/sim/driver_facts.expected, `capture_free_stream_ordered`:
                // the free refused with 1, the capture still active, its end a graph)
                for (key, want) in [
                    ("prefree", 1),
                    ("status", 1),
                    ("small", 0),
                    ("end", 0),
                    ("later", 0),
                ] {
                    assert_eq!(
                        field(&plain.stdout, key),
                        want,
                        "{args:?}: {}",
                        plain.stdout
                    );
                }
                for budget in ["5%", "off"] {
                    let what = format!("{args:?} budget {budget}");
                    let (o, stats) = go(&args, budget, None);
                    assert_exit(&o, 0, &what);
                    for key in codes {
                        assert_eq!(
                            field(&o.stdout, key),
                            field(&plain.stdout, key),
                            "{what} {key}: {} / without the library: {}",
                            o.stdout,
                            plain.stdout
                        );
                    }
                    assert!(
                        o.stderr
                            .contains("not a graph allocation, the driver answers"),
                        "{what}: {}",
                        tail(&o.stderr)
                    );
                    let pools = &stats[stats.find("\"pools\"").expect("pool statistics")..];
                    assert_eq!(
                        json_value(pools, "graph_freed").as_deref(),
                        Some("0"),
                        "{what}"
                    );
                }
            }
        }
    }
    for mode in ["global", "local"] {
        for pre in ["prefree", "prefree-malloc"] {
            let (o, _) = go(&[mode, "inside", pre], "5%", Some("graph-frees-reused"));
            assert_exit(&o, 1, &format!("graph-frees-reused {mode} {pre}"));
            assert_eq!(field(&o.stdout, "overlap"), 1, "{}", o.stdout);
            assert_eq!(field(&o.stdout, "prefree"), 0, "{}", o.stdout);
        }
    }
}

/// Should a driver take the captured free of a pool block after all (cuda-sim's
/// `VRAMSIM_CAPTURED_FREE_FAULT=accept`; CUDA refuses it), the block may be the graph's until
/// its first launch has run, and the pool does not follow launches: it holds the block for
/// good (counted in `graph_freed`), and no later request gets its bytes. capture_graph
/// `prefree` / `prefree-malloc`, global and thread-local, budget 5%. With
/// `graph-frees-reused` (the pool takes the block back at the capture's free) the next request
/// on the stream gets its bytes: the test fails.
#[test]
fn a_captured_free_a_driver_takes_holds_the_block_for_good() {
    let exe = workload("capture_graph");
    let json = vramshim_testkit::temp_dir("pool_graph_taken").join("stats.json");
    let go = |args: &[&str], debug: Option<&str>| {
        let _ = std::fs::remove_file(&json);
        let mut env = vec![
            ("VRAMSHIM_POOL", "stitch"),
            ("VRAMSHIM_POOL_BUDGET", "5%"),
            ("VRAMSHIM_STATS", json.to_str().unwrap()),
            ("VRAMSIM_CAPTURED_FREE_FAULT", "accept"),
        ];
        env.extend(debug.map(|d| ("VRAMSHIM_POOL_DEBUG", d)));
        let o = run(&exe, args, &env, "pool-graph-taken");
        (o, std::fs::read_to_string(&json).unwrap_or_default())
    };
    for mode in ["global", "local"] {
        for pre in ["prefree", "prefree-malloc"] {
            let what = format!("{mode} {pre}");
            let (o, stats) = go(&[mode, "inside", pre], None);
            assert_exit(&o, 0, &what);
            assert_eq!(field(&o.stdout, "prefree"), 0, "{what}: {}", o.stdout);
            assert_eq!(field(&o.stdout, "overlap"), 0, "{what}: {}", o.stdout);
            assert_eq!(field(&o.stdout, "end"), 0, "{what}: {}", o.stdout);
            assert!(
                o.stderr
                    .contains("as a free node of a graph: the graph's for good"),
                "{what}: {}",
                tail(&o.stderr)
            );
            let pools = &stats[stats.find("\"pools\"").expect("pool statistics")..];
            assert_eq!(
                json_value(pools, "graph_freed").as_deref(),
                Some("1"),
                "{what}"
            );
            assert_eq!(
                json_value(pools, "graph_freed_bytes").as_deref(),
                Some("4194304"),
                "{what}"
            );
            let (o, _) = go(&[mode, "inside", pre], Some("graph-frees-reused"));
            assert_exit(&o, 1, &format!("graph-frees-reused {what}"));
            assert_eq!(field(&o.stdout, "overlap"), 1, "{}", o.stdout);
        }
    }
}

/// A stream that joins a capture (it waits on an event recorded in the capturing stream: CUDA's
/// cross-stream capture) captures too, though no begin call names it: capture_graph `joined`
/// does the capture's allocations and frees on such a stream J. The 4 MiB request on J inside
/// the capture goes to the driver (an allocation node: the 4 MiB after the capture gets other
/// bytes), J reports the capture active once joined and none after its end; with `prefree`
/// the free on J of a block the pool served on J before the capture goes to the driver, and
/// every code is the one the same program gets without the library (the free refused, the
/// capture invalidated) and the block stays the program's. Global and thread-local captures,
/// freed inside and outside. With only the named streams seen as capturing (`joins-unseen`)
/// the pool serves J's requests and takes back J's frees: a request after the capture gets
/// the bytes of a block the graph or the program still has, the test fails.
#[test]
fn a_stream_that_joins_a_capture_captures_through_the_pool_too() {
    let exe = workload("capture_graph");
    let go = |args: &[&str], debug: Option<&str>| {
        let mut env = vec![
            ("VRAMSHIM_POOL", "stitch"),
            ("VRAMSHIM_POOL_BUDGET", "5%"),
            ("VRAMSHIM_LOG", "debug"),
        ];
        env.extend(debug.map(|d| ("VRAMSHIM_POOL_DEBUG", d)));
        run(&exe, args, &env, "pool-graph-join")
    };
    let codes = [
        "prefree", "status", "small", "big", "end", "frees", "later", "overlap", "launches",
        "joined",
    ];
    for mode in ["global", "local"] {
        for free in ["inside", "outside"] {
            let what = format!("{mode} {free}");
            let o = go(&[mode, free, "joined"], None);
            assert_exit(&o, 0, &what);
            assert_eq!(field(&o.stdout, "joined"), 1, "{what}: {}", o.stdout);
            assert_eq!(field(&o.stdout, "overlap"), 0, "{what}: {}", o.stdout);
            assert_eq!(field(&o.stdout, "end"), 0, "{what}: {}", o.stdout);
            assert_eq!(field(&o.stdout, "frees"), 0, "{what}: {}", o.stdout);
            assert_eq!(field(&o.stdout, "launches"), 0, "{what}: {}", o.stdout);
            assert!(
                o.stderr
                    .contains("on a capturing stream: a graph allocation, the driver's"),
                "{what}: {}",
                tail(&o.stderr)
            );
            let args = [mode, free, "prefree", "joined"];
            let plain =
                vramshim_testkit::run_with_preload(&exe, &args, &[], None, "pool-graph-join-plain");
            assert_exit(&plain, 0, &format!("{args:?} without the library"));
            assert_eq!(field(&plain.stdout, "prefree"), 1, "{}", plain.stdout);
            let o = go(&args, None);
            assert_exit(&o, 0, &format!("{args:?}"));
            for key in codes {
                assert_eq!(
                    field(&o.stdout, key),
                    field(&plain.stdout, key),
                    "{args:?} {key}: {} / without the library: {}",
                    o.stdout,
                    plain.stdout
                );
            }
        }
    }
    for mode in ["global", "local"] {
        let o = go(&[mode, "inside", "joined"], Some("joins-unseen"));
        assert_exit(&o, 1, &format!("joins-unseen {mode}"));
        assert_eq!(field(&o.stdout, "overlap"), 1, "{}", o.stdout);
        let o = go(&[mode, "inside", "prefree", "joined"], Some("joins-unseen"));
        assert_exit(&o, 1, &format!("joins-unseen {mode} prefree"));
        assert_eq!(field(&o.stdout, "prefree"), 0, "{}", o.stdout);
        assert_eq!(field(&o.stdout, "overlap"), 1, "{}", o.stdout);
    }
}

/// A capture race (`tests/workloads/pool/<src>.c`: thread B begins a global-mode capture while
/// another thread's call is stopped, see `capture_race` in `pool_workload.h`), built once and
/// run through both begin-capture entry points (`runtime`, `driver`) with `env`, the library's
/// pause point `pause` armed (`VRAMSHIM_POOL_DEBUG`, `VRAMSHIM_POOL_PAUSE_FDS`): the workload
/// orders its threads by handshake with the library, never by sleeping.
struct CaptureRace<'a> {
    exe: PathBuf,
    env: &'a [(&'a str, &'a str)],
    pause: &'a str,
}

impl<'a> CaptureRace<'a> {
    fn new(src: &str, exe: &str, env: &'a [(&'a str, &'a str)], pause: &'a str) -> Self {
        let path = vramshim_testkit::temp_dir(exe).join(exe);
        vramshim_testkit::compile_c_to(
            &path,
            &[&format!("tests/workloads/pool/{src}.c")],
            Link::SharedRuntime,
            &["-lpthread"],
        );
        CaptureRace {
            exe: path,
            env,
            pause,
        }
    }

    /// Runs the race with `args` after the entry point and the switch `debug` (if any) beside
    /// the pause point: each run must print `fields` as given and exit with `exit`. The runs'
    /// outputs, with their entry points.
    #[track_caller]
    fn expect(
        &self,
        args: &[&str],
        debug: Option<&str>,
        exit: i32,
        fields: &[(&str, i64)],
    ) -> Vec<(&'static str, RunOutput)> {
        let switches = [Some(self.pause), debug].into_iter().flatten();
        let switches = switches.collect::<Vec<_>>().join(",");
        let mut env = self.env.to_vec();
        env.extend([
            ("VRAMSHIM_POOL_DEBUG", switches.as_str()),
            ("VRAMSHIM_POOL_PAUSE_FDS", "40,41"),
        ]);
        ["runtime", "driver"]
            .into_iter()
            .map(|entry| {
                let argv: Vec<&str> = std::iter::once(entry).chain(args.iter().copied()).collect();
                let o = run(&self.exe, &argv, &env, "pool-capture-race");
                let what = format!("{argv:?} {switches}");
                for &(key, want) in fields {
                    assert_eq!(
                        field(&o.stdout, key),
                        want,
                        "{what} {key}: {}\n{}",
                        o.stdout,
                        tail(&o.stderr)
                    );
                }
                assert_exit(&o, exit, &what);
                (entry, o)
            })
            .collect()
    }
}

/// A capture another thread begins while the pool serves a request: the request decided,
/// under the pool's lock, that no capture forbids its calls, and is stopped inside its first
/// `cuMemCreate` (cuda-sim's pause point); thread B then begins a global-mode capture, through
/// the runtime and through the driver. The begin hook records the capture and waits for the
/// request to be done before the real call: the library stops B where it found the pool's lock
/// held (`pause-begin`) before B's begin returned, and lets it go on once the request returned,
/// so the request's calls precede the capture and B's end returns 0. With the begin recorded
/// after the real call and not waiting (`begin-unordered`, the old order) B's begin returns
/// first (`begun_first=1`) and the request's `cuMemCreate` runs inside B's capture, which the
/// real driver allows (cuda-sim answers so): this request's calls leave the capture valid,
/// worker 0, end 0. A request that synchronizes needs the order: capture_window `sync` (the
/// worker's second 64 MiB `cudaMalloc` takes back the first after a `cuCtxSynchronize`, the
/// pause point) ends the same way (0, 0, 0), and with `begin-unordered` the synchronization runs
/// inside B's capture, which the driver invalidates: end 901, exit 1.
#[test]
fn a_capture_begun_during_a_pool_request_waits_for_it() {
    let env = [
        ("VRAMSHIM_POOL", "stitch"),
        ("VRAMSIM_PAUSE_IN", "cuMemCreate"),
    ];
    let race = CaptureRace::new("capture_window", "pool_capture_window", &env, "pause-begin");
    let ok = [("begun_first", 0), ("worker", 0), ("end", 0)];
    race.expect(&[], None, 0, &ok);
    let unordered = [("begun_first", 1), ("worker", 0), ("end", 0)];
    race.expect(&[], Some("begin-unordered"), 0, &unordered);
    let env = [
        ("VRAMSHIM_POOL", "stitch"),
        ("VRAMSIM_PAUSE_IN", "cuCtxSynchronize"),
    ];
    let race = CaptureRace::new(
        "capture_window",
        "pool_capture_window_sync",
        &env,
        "pause-begin",
    );
    race.expect(&["sync"], None, 0, &ok);
    let unordered = [("begun_first", 1), ("end", 901)];
    race.expect(&["sync"], Some("begin-unordered"), 1, &unordered);
}

/// The cap empties the driver's pools (`cuCtxSynchronize`) before it would refuse a request:
/// the question whether a capture forbids the synchronization and the call are one section a
/// begin on another thread waits for. capture_window `settle` (a 48 MiB cap, no pool; the
/// driver's pool caches the worker's freed 40 MiB, and its next 40 MiB `cudaMallocAsync` makes
/// the cap settle; `VRAMSIM_PAUSE_IN=cuCtxSynchronize` stops the synchronization after the
/// question): the library stops B where it found the section in flight (`pause-begin`) before
/// B's begin returned, the worker gets 0 and B's end 0. With the section ungated
/// (`sections-ungated`) B's begin returns first and the synchronization runs inside B's global
/// capture: end 901, exit 1.
#[test]
fn the_cap_never_settles_the_driver_s_pools_inside_a_capture_begun_meanwhile() {
    let env = [
        ("VRAMSHIM_CAP", "48MiB"),
        ("VRAMSHIM_CAP_CONTEXT", "exclude"),
        ("VRAMSIM_MEMORY", "1GiB"),
        ("VRAMSIM_CONTEXT_OVERHEAD", "0"),
        ("VRAMSIM_PAUSE_IN", "cuCtxSynchronize"),
        ("VRAMSHIM_LOG", "debug"),
    ];
    let race = CaptureRace::new(
        "capture_window",
        "pool_capture_window_settle",
        &env,
        "pause-begin",
    );
    let ok = [("begun_first", 0), ("worker", 0), ("end", 0)];
    race.expect(&["settle"], None, 0, &ok);
    let ungated = [("begun_first", 1), ("end", 901)];
    race.expect(&["settle"], Some("sections-ungated"), 1, &ungated);
}

/// The section of the cap's settle reaches over the real allocation of the request that wanted
/// it: the request began before any capture a begin on another thread starts while the settle
/// is in flight, so its allocation must precede that capture. capture_window `settled` (the
/// worker and the 48 MiB cap of `settle`): the library stops the worker's request once the
/// driver's pools are emptied (`pause-settled`), before its `cudaMallocAsync` on a stream that
/// does not capture; B then begins a global capture, and the library stops B where it found the
/// section still open (`pause-begin`) before B's begin returned: the worker gets 0 and B's end
/// 0. With the section ended at the settle, as once (`settle-unheld`), B's begin returns while
/// the worker is stopped, and the allocation, made inside B's global capture, is refused (900)
/// and invalidates it: end 901, exit 1. The section ends when the allocation returned: B does
/// not wait out its time limit for a section left open (the library's warning that a capture
/// begins while a call of its own is in flight).
#[test]
fn the_cap_s_settle_holds_a_begin_until_the_request_s_own_allocation_returned() {
    let env = [
        ("VRAMSHIM_CAP", "48MiB"),
        ("VRAMSHIM_CAP_CONTEXT", "exclude"),
        ("VRAMSIM_MEMORY", "1GiB"),
        ("VRAMSIM_CONTEXT_OVERHEAD", "0"),
        ("VRAMSHIM_LOG", "debug"),
    ];
    let race = CaptureRace::new(
        "capture_window",
        "pool_capture_window_settled",
        &env,
        "pause-settled,pause-begin",
    );
    let ok = [("begun_first", 0), ("worker", 0), ("end", 0)];
    for (entry, o) in race.expect(&["settled"], None, 0, &ok) {
        // B waited for the section only until the allocation returned, not for its time limit
        assert!(
            !o.stderr.contains("still in flight on another thread"),
            "{entry}: the settle's section outlived the request's allocation:\n{}",
            tail(&o.stderr)
        );
    }
    let unheld = [("begun_first", 1), ("worker", 900), ("end", 901)];
    race.expect(&["settled"], Some("settle-unheld"), 1, &unheld);
}

/// The section the cap's settle keeps open for the request's own allocation ends however the
/// request ends: when the charge is refused after all (no real call follows) and when the
/// real call fails. A section left open would make every later begin on another thread wait
/// out its time limit (5 s) and warn that a call of the library's is in flight. capture_window
/// `short` (the 48 MiB cap of `settled`: the worker keeps 16 MiB, the driver's pool caches 24
/// freed stream-ordered, its 40 MiB request is refused after the settle gave back the 24) and
/// `failed` (the worker of `settle`, the driver's second `cuMemAllocAsync` failing: the settle
/// makes room, the allocation fails): B begins after the worker's request returned, with
/// `pause-begin` armed; the library must not stop it (waited 0), no warning, B's end 0
/// (cuda-sim's log, `VRAMSIM_DEBUG=1`, shows the settle's trim and the failed call).
/// Removing the release of the refused charge (`Cap::reserve_checked`) fails `short`, and
/// that of the failed call (`record_alloc`) fails `failed`: waited 1, the warning.
#[test]
fn the_cap_s_settle_ends_its_section_when_the_request_is_refused_or_its_allocation_fails() {
    let env = [
        ("VRAMSHIM_CAP", "48MiB"),
        ("VRAMSHIM_CAP_CONTEXT", "exclude"),
        ("VRAMSIM_MEMORY", "1GiB"),
        ("VRAMSIM_CONTEXT_OVERHEAD", "0"),
        ("VRAMSHIM_LOG", "debug"),
        ("VRAMSIM_DEBUG", "1"),
    ];
    let failing = [env.as_slice(), &[("VRAMSIM_FAIL", "cuMemAllocAsync:nth=2")]].concat();
    for (mode, env) in [("short", env.as_slice()), ("failed", failing.as_slice())] {
        let race = CaptureRace::new(
            "capture_window",
            &format!("pool_capture_window_{mode}"),
            env,
            "pause-begin",
        );
        let ok = [("worker", 2), ("waited", 0), ("end", 0)];
        for (entry, o) in race.expect(&[mode], None, 0, &ok) {
            // the settle trimmed the driver's pool; "failed": the real allocation failed after it
            let settled = o.stderr.find("vramsim: cuMemPoolTrimTo -> 0");
            let failed = o.stderr.rfind("vramsim: cuMemAllocAsync -> 2");
            assert!(
                settled.is_some() && (mode == "short" || failed > settled),
                "{entry} {mode}: no settle before the request's end:\n{}",
                tail(&o.stderr)
            );
            assert!(
                !o.stderr.contains("still in flight on another thread"),
                "{entry} {mode}: the settle's section outlived the request:\n{}",
                tail(&o.stderr)
            );
        }
    }
}

/// The cap empties the driver's pools for a page the pool needs while the pool's lock is held
/// (the pool's growth charges each page, and a refused charge settles first): a begin-capture
/// call in flight on another thread then waits for that lock before its real call, so the
/// capture cannot begin before the settle's synchronization is made, and the settle must not
/// wait for the begin (it would wait for the lock its own thread holds). capture_settle_locked
/// (48 MiB cap, no context charged; the driver's pool caches the worker's freed 40 MiB; the
/// worker's 16 MiB `cudaMalloc` creates the pool, whose first call stops under the lock:
/// `VRAMSIM_PAUSE_IN=cuMemGetAllocationGranularity`; B begins a global capture meanwhile): the
/// library stops B where it found the lock held (`pause-begin`) before B's begin returned, the
/// worker gets its 16 MiB (0) and B's end 0. With the settle waiting for the begin (the
/// section not marked as made under the pool's lock, a temporary edit) it waits out
/// `captures::BEGIN_WAIT` (B stays stopped until the request returns), then counts B's begin
/// as a capture under way, does not synchronize, and the cap refuses the page: worker 2. With
/// the begin not waiting for the pool's lock (`begin-unordered`) B's begin returns first and the
/// request, which began before the capture, finds it under way: the cap may not empty the
/// driver's pools (no synchronization during a capture) and refuses the page: worker 2 (out of
/// memory), exit 1.
#[test]
fn the_cap_settles_the_driver_s_pools_under_the_pool_s_lock_without_waiting_for_a_begin() {
    let env = [
        ("VRAMSHIM_POOL", "stitch"),
        ("VRAMSHIM_CAP", "48MiB"),
        ("VRAMSHIM_CAP_CONTEXT", "exclude"),
        ("VRAMSIM_MEMORY", "1GiB"),
        ("VRAMSIM_CONTEXT_OVERHEAD", "0"),
        ("VRAMSIM_PAUSE_IN", "cuMemGetAllocationGranularity"),
        ("VRAMSHIM_LOG", "debug"),
    ];
    let race = CaptureRace::new(
        "capture_settle_locked",
        "pool_capture_settle_locked",
        &env,
        "pause-begin",
    );
    let ok = [("begun_first", 0), ("worker", 0), ("end", 0)];
    race.expect(&[], None, 0, &ok);
    let unordered = [("begun_first", 1), ("worker", 2), ("end", 0)];
    race.expect(&[], Some("begin-unordered"), 1, &unordered);
}

/// The runtime's last error after a refusal is set with a real `cudaMalloc(SIZE_MAX)`, made
/// after the pool's lock is let go: the question whether a capture forbids it and the call are
/// one section a begin on another thread waits for. capture_window `oom` (a 32 MiB device, the
/// worker's 64 MiB refused, `VRAMSIM_PAUSE_IN=cuMemAlloc` stops the runtime's `cuMemAlloc`
/// after the question): the library stops B where it found the section in flight
/// (`pause-begin`) before B's begin returned, the worker gets 2 and B's end 0. With the
/// section ungated (`sections-ungated`) B's begin returns first, the `cudaMalloc` runs inside
/// B's global capture and invalidates it: end 901, exit 1.
#[test]
fn the_runtime_s_last_error_is_never_set_inside_a_capture_begun_meanwhile() {
    let env = [
        ("VRAMSHIM_POOL", "stitch"),
        ("VRAMSIM_PAUSE_IN", "cuMemAlloc"),
        ("VRAMSIM_MEMORY", "32MiB"),
        ("VRAMSIM_CONTEXT_OVERHEAD", "0"),
    ];
    let race = CaptureRace::new(
        "capture_window",
        "pool_capture_window_oom",
        &env,
        "pause-begin",
    );
    let ok = [("begun_first", 0), ("worker", 2), ("end", 0)];
    race.expect(&["oom"], None, 0, &ok);
    let ungated = [("begun_first", 1), ("end", 901)];
    race.expect(&["oom"], Some("sections-ungated"), 1, &ungated);
}

/// A begin-capture call that fails is no capture to the pool's requests on other threads,
/// and one that succeeds is one: capture_begin_fail stops thread B inside its real begin call
/// (`VRAMSIM_PAUSE_IN=cuStreamBeginCapture`, global mode, through the runtime and through the
/// driver) while a worker asks for 64 MiB, which the pool serves after a synchronization (the
/// 64 MiB cudaFree'd before) or by growing: the library stops the worker's request where it
/// found B's begin in flight (`pause-request`) before the request returned, and lets it go on
/// once B's begin returned. On the legacy stream the begin fails: the worker's request
/// synchronizes (syncs 1). On a stream the begin succeeds: the pool grows instead (syncs 0; the
/// driver refuses a synchronization during any capture) and B's capture ends valid (0). The
/// worker gets its memory (0) either way. With the capture recorded before the real call
/// (`begin-recorded-first`, the old order) the worker's request acts on the capture that never
/// began without waiting: it returns first, no synchronization on the legacy stream, the test
/// fails.
#[test]
fn a_begin_that_fails_is_no_capture_to_other_threads() {
    let env = [
        ("VRAMSHIM_POOL", "stitch"),
        ("VRAMSIM_PAUSE_IN", "cuStreamBeginCapture"),
    ];
    let race = CaptureRace::new(
        "capture_begin_fail",
        "pool_capture_begin_fail",
        &env,
        "pause-request",
    );
    let failed = [("worker", 0), ("worker_first", 0), ("syncs", 1)];
    for (entry, o) in race.expect(&["legacy"], None, 0, &failed) {
        assert_ne!(field(&o.stdout, "begin"), 0, "{entry}: {}", o.stdout);
    }
    let begun = [("worker", 0), ("worker_first", 0), ("syncs", 0), ("end", 0)];
    race.expect(&["stream"], None, 0, &begun);
    let recorded_first = [("worker", 0), ("worker_first", 1), ("syncs", 0)];
    race.expect(
        &["legacy"],
        Some("begin-recorded-first"),
        1,
        &recorded_first,
    );
}

/// A begin-capture hook waits for the request under the pool's lock whatever the pool's mode
/// reads (in this test process the pool was never turned on): the process's first request
/// sets the mode just before it takes the lock, and a pool falling back to pass-through
/// finishes the requests under it, so a hook that skipped the lock unless the mode read "on"
/// could let a capture begin while such a request makes the calls it forbids.
#[test]
fn a_capture_s_begin_waits_for_the_pool_s_lock_whatever_the_mode_reads() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};
    assert_ne!(
        super::MODE.load(Ordering::Relaxed),
        super::ON,
        "this test needs a process whose pool is not on (VRAMSHIM_POOL unset)"
    );
    let returned = Arc::new(AtomicBool::new(false));
    let waiter = super::with_pools(|_| {
        let r = returned.clone();
        let waiter = std::thread::spawn(move || {
            super::wait_for_requests();
            r.store(true, Ordering::Release);
        });
        // a waiter that does not wait returns long before this
        std::thread::sleep(std::time::Duration::from_millis(200));
        assert!(
            !returned.load(Ordering::Acquire),
            "the begin returned while a request held the pool's lock"
        );
        waiter
    });
    waiter.join().unwrap();
    assert!(returned.load(Ordering::Acquire));
}

/// Under a cap, a request that must grow past it while another thread's global capture forbids
/// the worker potentially unsafe calls fails with out of memory, as it fails without the pool
/// (the cap refuses before CUDA is asked); the capture stays valid (the pool does not ask the
/// runtime to record the error then) and the same request succeeds after it. The
/// capture_threads workload under a 68 MiB cap, with and without the budget: the worker's
/// 64 MiB `cudaMalloc` is its one failure, code 2 (`cudaErrorMemoryAllocation`).
#[test]
fn the_cap_s_out_of_memory_reaches_the_worker_and_the_capture_stays_valid() {
    let exe = workload("capture_threads");
    for budget in ["5%", "off"] {
        let env = [
            ("VRAMSHIM_POOL", "stitch"),
            ("VRAMSHIM_POOL_BUDGET", budget),
            ("VRAMSHIM_CAP", "68MiB"),
            ("VRAMSHIM_CAP_CONTEXT", "exclude"),
            ("VRAMSIM_MEMORY", "1GiB"),
            ("VRAMSIM_CONTEXT_OVERHEAD", "0"),
        ];
        let o = run(
            &exe,
            &["runtime", "global", "global"],
            &env,
            "pool-capture-cap",
        );
        let what = format!("budget {budget}: {}{}", o.stdout, o.stderr);
        // exit 2: a request failed other than by the capture's refusal
        assert_exit(&o, 2, &what);
        assert_eq!(field(&o.stdout, "end"), 0, "{what}");
        assert_eq!(field(&o.stdout, "errors"), 1, "{what}");
        assert!(o.stderr.contains("request failed: 2"), "{what}");
    }
}

/// Under a cap without the pool (and with it), a runtime request the cap refuses while
/// another thread's global capture forbids the worker unsafe calls fails with out of memory
/// and leaves the capture valid: the cap does not ask the runtime to record the error then
/// (a real `cudaMalloc`, which the capture forbids and which invalidates it). capture_threads
/// `capped`: the worker's one request, 128 MiB under a 68 MiB cap, is the first call the
/// capture forbids and the cap refuses it before anything reaches cuda-sim; through each
/// begin/end-capture entry point, and with the worker capturing itself (`self`).
#[test]
fn a_cap_refusal_during_a_capture_leaves_the_capture_valid() {
    let exe = workload("capture_threads");
    for (pool, budget) in [("off", "5%"), ("stitch", "5%"), ("stitch", "off")] {
        for entry in ["runtime", "driver", "lookup"] {
            for extra in [None, Some("self")] {
                let env = [
                    ("VRAMSHIM_POOL", pool),
                    ("VRAMSHIM_POOL_BUDGET", budget),
                    ("VRAMSHIM_CAP", "68MiB"),
                    ("VRAMSHIM_CAP_CONTEXT", "exclude"),
                    ("VRAMSIM_MEMORY", "1GiB"),
                    ("VRAMSIM_CONTEXT_OVERHEAD", "0"),
                ];
                let mut args = vec![entry, "global", "global"];
                args.extend(extra);
                args.push("capped");
                let o = run(&exe, &args, &env, "cap-capture");
                let what = format!(
                    "pool {pool} budget {budget} {args:?}: {}{}",
                    o.stdout, o.stderr
                );
                // exit 2: the request failed, not the capture (exit 1)
                assert_exit(&o, 2, &what);
                assert_eq!(field(&o.stdout, "end"), 0, "{what}");
                assert_eq!(field(&o.stdout, "errors"), 1, "{what}");
                assert_eq!(field(&o.stdout, "served"), 0, "{what}");
                assert!(o.stderr.contains("request failed: 2"), "{what}");
            }
        }
    }
}

#[test]
fn injected_driver_faults_fail_cleanly_and_later_requests_succeed() {
    let exe = workload("faults");
    for spec in ["cuMemCreate:nth=3", "cuMemMap:nth=4", "cuMemCreate:nth=2"] {
        let o = run(
            &exe,
            &["10"],
            &[("VRAMSHIM_POOL", "stitch"), ("VRAMSIM_FAIL", spec)],
            "pool-faults",
        );
        assert_exit(&o, 0, spec);
        assert_eq!(field(&o.stdout, "other_errors"), 0, "{spec}");
        assert_eq!(field(&o.stdout, "mismatches"), 0, "{spec}");
        assert!(field(&o.stdout, "ok") > 0, "{spec}: {}", o.stdout);
        if field(&o.stdout, "failed") > 0 {
            assert!(field(&o.stdout, "recovered") > 0, "{spec}: {}", o.stdout);
        }
    }
}

#[test]
fn unknown_pool_setting_warns_once_and_passes_through() {
    let exe = workload("faults");
    let o = run(&exe, &["2"], &[("VRAMSHIM_POOL", "bogus")], "pool-bogus");
    assert_eq!(o.code(), Some(0), "{}", o.stderr);
    assert_eq!(o.stderr.matches("VRAMSHIM_POOL").count(), 1, "{}", o.stderr);
}

#[test]
fn cached_pages_stay_under_the_cap() {
    // vit: peak live 160.5 MiB; the pool caches up to ~230 MiB when nothing limits it. Under
    // VRAMSHIM_CAP=172MiB its physical growth stops at the cap and it dissolves cached blocks
    // instead: the replay completes with every pattern intact (the cap charges live bytes,
    // the pool never refuses below them).
    let exe = replay_exe();
    let trace = trace_file("vit_train.rmm.csv");
    let o = run(
        &exe,
        &["--quiet", "--pattern", "memcpy", trace.to_str().unwrap()],
        &[
            ("VRAMSHIM_POOL", "stitch"),
            ("VRAMSHIM_CAP", "172MiB"),
            ("VRAMSIM_MEMORY", "1GiB"),
            ("VRAMSIM_CONTEXT_OVERHEAD", "0"),
        ],
        "pool-cap",
    );
    assert_exit(&o, 0, "");
    assert_eq!(field(&o.stdout, "mismatches"), 0);
}

/// Two threads' per-thread default streams are different streams: if they shared one free
/// list, a block freed on thread A's stream could be reused at once on thread B's while A's
/// work still uses it.
#[test]
fn per_thread_default_streams_get_their_own_pool_stream() {
    use vramshim_trace::flags::PER_THREAD_STREAM;
    let here = super::pool_stream_id(0, PER_THREAD_STREAM);
    assert_eq!(
        here,
        super::pool_stream_id(0x2, 0),
        "CU_STREAM_PER_THREAD is this thread's"
    );
    let there = std::thread::spawn(|| super::pool_stream_id(0, PER_THREAD_STREAM))
        .join()
        .unwrap();
    assert_ne!(here, there);
    assert_ne!(here, 0);
    assert_eq!(
        super::pool_stream_id(0, 0),
        0,
        "handle 0 without _ptsz is the legacy stream"
    );
    assert_eq!(
        super::pool_stream_id(0x1, 0),
        0,
        "CU_STREAM_LEGACY is the legacy stream"
    );
    assert_eq!(super::pool_stream_id(0xdead0, PER_THREAD_STREAM), 0xdead0);
}

/// Peak live bytes of a shipped log (the physical limit), as the pool crate computes it.
fn peak_live(trace: &std::path::Path) -> u64 {
    let t = vramshim_pool::rmm_csv::parse_file(trace).unwrap();
    vramshim_pool::replay::peak_live(&t.events)
}

/// What `vramshim replay TRACE --pool stitch --json ARGS` prints (the command built beside the
/// library), which must succeed.
fn vramshim_replay_json(trace: &std::path::Path, args: &[&str]) -> String {
    let vramshim = vramshim_testkit::vramshim_exe();
    let out = std::process::Command::new(&vramshim)
        .args(["replay", "--pool", "stitch", "--json"])
        .args(args)
        .arg(trace)
        .env("VRAMSHIM_NO_PROGRESS", "1")
        .output()
        .unwrap();
    let json = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{}: {json}\n{}",
        trace.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    json
}

/// The number after `"key":` in a JSON text (the first occurrence), as a string.
fn json_value(text: &str, key: &str) -> Option<String> {
    let k = format!("\"{key}\"");
    let i = text.find(&k)? + k.len();
    let rest = text[i..].trim_start_matches([' ', ':', '[', '"']);
    Some(
        rest.chars()
            .take_while(|c| *c != '"' && *c != ',' && *c != ']' && *c != '}')
            .collect::<String>()
            .trim()
            .to_string(),
    )
}

/// The simulated device's own high-water mark of device 0 (every page the pool created),
/// read with vramsim-smi; the device is removed afterwards.
fn sim_high_water(name: &str) -> u64 {
    let smi = vramshim_testkit::profile_dir().join("vramsim-smi");
    assert!(
        smi.exists(),
        "{} is not built: cargo build --release -p vramsim-smi",
        smi.display()
    );
    let o = std::process::Command::new(&smi).arg(name).output().unwrap();
    let out = String::from_utf8_lossy(&o.stdout);
    if let Some(f) = json_value(&out, "file") {
        let _ = std::fs::remove_file(f);
    }
    json_value(&out, "high_water")
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("vramsim-smi {name}: no high_water in {out}"))
}

/// The log-replay workload pooled (under `cap`, context excluded, as `vramshim demo` runs
/// it): the run and the device's high-water mark.
fn pooled_run(
    trace: &std::path::Path,
    cap: Option<u64>,
    env: &[(&str, &str)],
    args: &[&str],
) -> (RunOutput, u64) {
    let exe = replay_exe();
    let mut c = vramshim_testkit::sim_command(&exe, "pool-cap");
    let name = c
        .get_envs()
        .find(|(k, _)| *k == "VRAMSIM_NAME")
        .and_then(|(_, v)| v)
        .unwrap()
        .to_string_lossy()
        .into_owned();
    c.args(args)
        .arg(trace)
        .env("VRAMSHIM_POOL", "stitch")
        .env("VRAMSHIM_CAP_CONTEXT", "exclude")
        .env("VRAMSIM_CONTEXT_OVERHEAD", "0");
    if let Some(cap) = cap {
        c.env("VRAMSHIM_CAP", cap.to_string());
    }
    c.envs(env.iter().copied());
    vramshim_testkit::preload(&mut c, &interposer_lib());
    let o = vramshim_testkit::run(&mut c);
    let hw = sim_high_water(&name);
    (o, hw)
}

fn pooled_under_cap(trace: &str, cap: u64, env: &[(&str, &str)]) -> (RunOutput, u64) {
    pooled_run(
        &trace_file(trace),
        Some(cap),
        env,
        &["--pattern", "memcpy", "--stop-on-failure", "--quiet"],
    )
}

/// `trace` replayed through the pool under `cap` (`what` names the run) completes, its
/// patterns intact, and the simulated device's high-water mark stays within the cap and at
/// or above the trace's peak live bytes; the pool pages' peak is said.
fn completes_under_cap(trace: &str, cap: u64, env: &[(&str, &str)], what: &str) {
    let live = peak_live(&trace_file(trace));
    let (o, hw) = pooled_under_cap(trace, cap, env);
    assert_exit(
        &o,
        0,
        &format!("{what}: refused under cap {cap} (peak live {live})"),
    );
    assert_eq!(field(&o.stdout, "mismatches"), 0, "{trace}");
    assert!(
        hw <= cap && hw >= live,
        "{what}: device high water {hw} B, cap {cap} B, peak live {live} B"
    );
    eprintln!(
        "{what}: completed under {cap} B; pool pages peak at {:.4} x peak live",
        hw as f64 / live as f64
    );
}

/// `trace` replayed through the pool under `cap` (`what` names the run) is refused: exit 2,
/// some request failed.
fn refused_under_cap(trace: &str, cap: u64, env: &[(&str, &str)], what: &str) {
    let (o, _) = pooled_under_cap(trace, cap, env);
    assert_eq!(o.code(), Some(2), "{what}: {}", o.stdout);
    assert!(field(&o.stdout, "failed") > 0);
}

/// The pool as it runs by default (with its budget), and without a budget.
const POOLS: [&[(&str, &str)]; 2] = [&[], &[("VRAMSHIM_POOL_BUDGET", "off")]];

#[test]
fn live_pool_completes_every_trace_under_a_cap_5_percent_above_peak_live() {
    // The cap bounds the pool's physical pages (the device's own high-water mark shows it)
    // and the live bytes; 1.05 x peak live is issue 6's tightness target, met live, with the
    // pool's budget and without.
    for t in [
        "vit_train.rmm.csv",
        "bert_serve.rmm.csv",
        "t5_train.rmm.csv",
    ] {
        for env in POOLS {
            let live = peak_live(&trace_file(t));
            completes_under_cap(t, live + live / 20, env, &format!("{t} {env:?}"));
        }
    }
    // The old synchronization choices (a cudaFree'd twin waits while the request is placed
    // elsewhere) scatter blocks over shared pages: refused at the same cap. With the budget,
    // large blocks are carved by address out of the arena and take their earlier places
    // first, and near the device's limit the pool dissolves cached blocks before it grows,
    // which together make up for it: vit then needs 168 MiB (1.047 x, inside the cap), t5
    // 492 MiB (1.045 x, inside); t5 without the near-limit rules 502 MiB (1.066 x), and
    // without the budget vit needs 170 MiB (1.059 x).
    for (t, env, faults) in [
        ("t5_train.rmm.csv", POOLS[0], "lazy-sync,pressure-off"),
        ("vit_train.rmm.csv", POOLS[1], "lazy-sync"),
    ] {
        let live = peak_live(&trace_file(t));
        let mut env = env.to_vec();
        env.push(("VRAMSHIM_POOL_DEBUG", faults));
        refused_under_cap(t, live + live / 20, &env, &format!("{t} {env:?}"));
    }
}

#[test]
fn live_pool_completes_bert_under_a_cap_of_1_03_x_peak_live() {
    // Issue 17's smallest device, live: bert's log replayed (cudaMalloc/cudaFree, memcpy
    // patterns checked) under a cap of the whole pages within 1.03 x its peak live (214 MiB,
    // 1.023 x). The pool asks the device's room (what the cap still allows) and, that close
    // to the limit, re-forms its rounds' mappings; the simulated
    // device's own high-water mark stays under the cap. Without the rule
    // (`VRAMSHIM_POOL_DEBUG=pressure-off`) the same run is refused (exit 2), as the model
    // says (216 MiB then).
    const PAGE: u64 = 2 << 20;
    let t = "bert_serve.rmm.csv";
    let live = peak_live(&trace_file(t));
    let cap = (live as f64 * 1.03) as u64 / PAGE * PAGE;
    completes_under_cap(t, cap, &[], t);
    refused_under_cap(
        t,
        cap,
        &[("VRAMSHIM_POOL_DEBUG", "pressure-off")],
        &format!("{t} pressure-off"),
    );
}

#[test]
fn live_pool_completes_t5_under_a_cap_of_1_03_x_peak_live() {
    // t5's smallest device, live: its log replayed under a cap of the whole pages within
    // 1.03 x its peak live (484 MiB, 1.028 x). Near the limit its blocks of more than a page
    // take no twin's place and their remainders go on free page ends (the pool's `ends`
    // rule); without it (`VRAMSHIM_POOL_DEBUG=ends-off`) the same run is refused (exit 2), as
    // the model says (486 MiB then).
    const PAGE: u64 = 2 << 20;
    let t = "t5_train.rmm.csv";
    let live = peak_live(&trace_file(t));
    let cap = (live as f64 * 1.03) as u64 / PAGE * PAGE;
    assert_eq!(cap, 484 << 20);
    completes_under_cap(t, cap, &[], t);
    refused_under_cap(
        t,
        cap,
        &[("VRAMSHIM_POOL_DEBUG", "ends-off")],
        &format!("{t} ends-off"),
    );
}

/// Memory-management driver calls in the simulated driver's call log (VRAMSIM_DEBUG=1).
fn sim_memory_calls(stderr: &str) -> u64 {
    const MEM: [&str; 7] = [
        "cuMemAddressReserve",
        "cuMemAddressFree",
        "cuMemCreate",
        "cuMemRelease",
        "cuMemMap",
        "cuMemUnmap",
        "cuMemSetAccess",
    ];
    stderr
        .lines()
        .filter_map(|l| l.strip_prefix("vramsim: "))
        .filter_map(|l| l.split_once(" -> ").map(|(n, _)| n))
        .filter(|n| MEM.contains(n) || n.starts_with("cuMemAlloc") || n.starts_with("cuMemFree"))
        .filter(|n| !n.contains("Host"))
        .count() as u64
}

#[test]
fn vramshim_replay_agrees_with_the_live_pool_on_every_shared_trace() {
    // issue 7's proof: `vramshim replay --pool stitch` (the pool crate on its accounting
    // device) and the interposer's pool on cuda-sim, fed the same log (the log-replay
    // workload's cudaMalloc/cudaFree), reserve the same peak (within one page) and make the
    // same driver calls, with no cap and under a cap 5% above peak live.
    const PAGE: u64 = 2 << 20;
    for trace in vramshim_testkit::shipped_traces() {
        let name = trace.file_name().unwrap().to_string_lossy().into_owned();
        let live = peak_live(&trace);
        for cap in [None, Some(live + live / 20)] {
            let cap_arg = cap.map(|c| c.to_string());
            let args: Vec<&str> = cap_arg.iter().flat_map(|c| ["--cap", c]).collect();
            let json = vramshim_replay_json(&trace, &args);
            let policies = &json[json.find("\"policies\"").unwrap()..];
            let model: u64 = json_value(policies, "peak_reserved")
                .unwrap()
                .parse()
                .unwrap();
            let model_calls: u64 = json_value(policies, "driver_calls")
                .unwrap()
                .parse()
                .unwrap();
            assert_eq!(json_value(policies, "completed").as_deref(), Some("true"));
            let (o, hw) = pooled_run(&trace, cap, &[("VRAMSIM_DEBUG", "1")], &["--quiet"]);
            assert_eq!(o.code(), Some(0), "{name} cap {cap:?}: {}", o.stdout);
            let calls = sim_memory_calls(&o.stderr);
            eprintln!(
                "{name} cap {cap:?}: peak reserved replay {model} B, live {hw} B; driver calls replay {model_calls}, live {calls}"
            );
            assert!(
                model.abs_diff(hw) <= PAGE,
                "{name} cap {cap:?}: replay reserves {model} B at its peak, the live pool {hw} B"
            );
            assert_eq!(model_calls, calls, "{name} cap {cap:?}: driver calls");
        }
    }
}

/// Memory driver calls of the log-replay workload pooled with `--repeat passes` (a loop).
fn driver_calls_repeated_with(trace: &std::path::Path, passes: u32, extra: &[(&str, &str)]) -> u64 {
    let mut env = vec![("VRAMSIM_DEBUG", "1")];
    env.extend_from_slice(extra);
    let n = passes.to_string();
    let (o, _) = pooled_run(trace, None, &env, &["--quiet", "--repeat", &n]);
    assert_eq!(o.code(), Some(0), "{}: {}", trace.display(), o.stdout);
    sim_memory_calls(&o.stderr)
}

#[test]
fn live_pool_makes_no_driver_call_after_the_first_pass() {
    // issue 6's steady state, live: a log replayed three times in a row (cudaMalloc and
    // cudaFree, each pass freeing what it left) makes every driver call in its first pass,
    // with the pool's budget (each pass replays the places of the one before, see
    // `stitch::rounds`) and without (every shape stays cached). The pool's fast path, which
    // the interposer tries before the general one, must not serve the allocation that ends
    // a round (nothing live): t5 made 38 calls in passes 2-3 when it did.
    for trace in vramshim_testkit::shipped_traces() {
        for env in POOLS {
            let one = driver_calls_repeated_with(&trace, 1, env);
            let three = driver_calls_repeated_with(&trace, 3, env);
            eprintln!(
                "{} {env:?}: driver calls 1 pass {one}, 3 passes {three}",
                trace.display()
            );
            assert!(one > 0);
            assert_eq!(
                one,
                three,
                "{} {env:?}: driver calls after the first pass",
                trace.display()
            );
        }
    }
    // Broken on purpose, they make calls in later passes: with the budget, each pass laid
    // out afresh instead of as the one before; without it, the old synchronization choices
    // re-pack t5's blocks in every pass.
    let t5 = trace_file("t5_train.rmm.csv");
    for (env, fault) in [(POOLS[0], "forget-rounds"), (POOLS[1], "lazy-sync")] {
        let mut env = env.to_vec();
        env.push(("VRAMSHIM_POOL_DEBUG", fault));
        let one = driver_calls_repeated_with(&t5, 1, &env);
        let three = driver_calls_repeated_with(&t5, 3, &env);
        assert!(three > one, "{env:?}: {one} then {three}");
    }
}

#[test]
fn a_pool_refusal_sets_the_runtime_last_error_once() {
    // 1 GiB on a 256 MiB device: the cap (none) admits it, the pool's pages are refused by
    // the device; the process must see it as CUDA reports an out-of-memory
    let exe = workload("oom_error");
    let o = run(
        &exe,
        &["1073741824"],
        &[
            ("VRAMSHIM_POOL", "stitch"),
            ("VRAMSIM_MEMORY", "256MiB"),
            ("VRAMSHIM_LOG", "debug"),
        ],
        "pool-oom-error",
    );
    assert!(
        o.stderr.contains("[pool]") || o.stderr.contains("pool:"),
        "the pool must have served the requests: {}",
        tail(&o.stderr)
    );
    assert_exit(&o, 0, "");
}

/// Peer access granted by the program reaches pool memory mapped before and after the grant
/// (through `cudaDeviceEnablePeerAccess` and through `cuCtxEnablePeerAccess` from the
/// entry-point table); without the pool the sim enforces the same rule on cuMemAlloc memory,
/// and with the pool's grant switched off (`VRAMSHIM_POOL_DEBUG=no-peer`) the test fails.
#[test]
fn peer_access_applies_to_pool_mappings() {
    let exe = workload("peer_access");
    for path in ["runtime", "driver"] {
        for (pool, debug, expect) in [("off", "", 0), ("stitch", "", 0), ("stitch", "no-peer", 1)] {
            let o = run(
                &exe,
                &[path],
                &[
                    ("VRAMSIM_DEVICES", "2"),
                    ("VRAMSHIM_POOL", pool),
                    ("VRAMSHIM_POOL_DEBUG", debug),
                    ("VRAMSHIM_LOG", "debug"),
                ],
                "pool-peer-access",
            );
            let what = format!("{path} pool={pool} debug={debug:?}");
            if pool == "stitch" {
                assert!(
                    o.stderr.contains("[pool]"),
                    "{what}: the pool must have served the requests: {}",
                    tail(&o.stderr)
                );
            }
            assert!(
                o.stdout.contains("before=1 "),
                "{what}: device 1 reached device 0's memory without peer access: {}",
                o.stdout
            );
            assert_exit(&o, expect, &what);
        }
    }
}

/// Peer access the program enables while its thread captures a stream (global mode) is
/// granted on the pool's mapped pages at once, and the capture stays valid: `cuMemSetAccess`
/// is allowed during any capture and invalidates none (tests/workloads/sim/driver_facts.expected,
/// `set_access`). peer_access `capture`, runtime and driver paths: device 1's fill of the
/// pool's block A, launched during the capture, succeeds (`a=0`), the end returns 0 and the
/// data reads back (`data=OK`). With the grant held back while the mode rules forbid the
/// thread unsafe calls (the old rule, a temporary edit of `CudaDevice::grant_peers`) the fill
/// during the capture is refused: the test fails.
#[test]
fn a_peer_grant_during_a_capture_is_made_at_once() {
    let exe = workload("peer_access");
    for path in ["runtime", "driver"] {
        let o = run(
            &exe,
            &[path, "capture"],
            &[
                ("VRAMSIM_DEVICES", "2"),
                ("VRAMSHIM_POOL", "stitch"),
                ("VRAMSHIM_LOG", "debug"),
            ],
            "pool-peer-capture",
        );
        assert!(
            o.stderr.contains("[pool]"),
            "{path}: the pool must have served the requests: {}",
            tail(&o.stderr)
        );
        assert_eq!(field(&o.stdout, "a"), 0, "{path}: {}", o.stdout);
        assert_eq!(field(&o.stdout, "end"), 0, "{path}: {}", o.stdout);
        assert!(o.stdout.contains("data=OK"), "{path}: {}", o.stdout);
        assert_exit(&o, 0, path);
    }
}

#[test]
fn blocks_a_thread_keeps_serve_other_threads_under_the_cap() {
    // a helper thread frees 48 MiB with cudaFreeAsync (its thread cache keeps some of those
    // blocks, live to the pool) and waits; the main thread's 40 MiB cudaMalloc under a 64 MiB
    // cap fits only in the helper's freed pages: the pool must drain the thread caches. The
    // blocks are of several pages, which the caches keep only without the layer replay
    // (`no-layers`: with it every free of a page or more reaches the pool at once).
    let exe = vramshim_testkit::temp_dir("pool_tcache_drain").join("pool_tcache_drain");
    vramshim_testkit::compile_c_to(
        &exe,
        &["tests/workloads/pool/tcache_drain.c"],
        Link::SharedRuntime,
        &["-lpthread"],
    );
    let env = |debug: &'static str| {
        [
            ("VRAMSHIM_POOL", "stitch"),
            ("VRAMSHIM_CAP", "64MiB"),
            ("VRAMSHIM_CAP_CONTEXT", "exclude"),
            ("VRAMSIM_MEMORY", "1GiB"),
            ("VRAMSIM_CONTEXT_OVERHEAD", "0"),
            ("VRAMSHIM_POOL_DEBUG", debug),
        ]
    };
    let o = run(&exe, &[], &env("no-layers"), "pool-tcache-drain");
    assert_exit(&o, 0, "");
    // the same with the caches never drained is refused: the test can fail
    let o = run(
        &exe,
        &[],
        &env("no-layers,tcache-no-drain"),
        "pool-tcache-no-drain",
    );
    assert_exit(&o, 1, "");
}

#[test]
fn pool_budget_values_parse_as_documented() {
    let parse = vramshim_pool::stitch::Budget::parse_ratio;
    assert_eq!(parse("0.05"), Ok(Some(0.05)));
    assert_eq!(parse(" 5% "), Ok(Some(0.05)));
    assert_eq!(parse("0"), Ok(Some(0.0)));
    assert_eq!(parse("OFF"), Ok(None));
    for bad in ["", "-0.1", "nan", "inf", "5%%", "five", "0.05x", "%"] {
        let e = parse(bad).unwrap_err();
        assert!(e.contains("0.05") && e.contains("5%"), "{bad:?}: {e}");
    }
}

/// The pool's budget under the interposer: each shared trace replayed with its patterns
/// checked on a device far larger than it needs, and the device's own high-water mark (every
/// page the pool held at once) within 1.10 x the trace's peak live bytes, where the pool
/// without a budget keeps up to 3.5 x (bert). `VRAMSHIM_POOL=stitch-tight` (another name for it) is
/// the same pool; with the budget ignored (`VRAMSHIM_POOL_DEBUG=ignore-budget`) bert's high
/// water is far above the bound: the test can fail.
#[test]
fn tight_pool_keeps_reserved_near_live_on_every_trace() {
    let bound = |live: u64| live + live / 10;
    let args = ["--pattern", "memcpy", "--stop-on-failure", "--quiet"];
    let device = [("VRAMSIM_MEMORY", "8GiB")];
    for trace in vramshim_testkit::shipped_traces() {
        let name = trace.file_name().unwrap().to_string_lossy().into_owned();
        let live = peak_live(&trace);
        let settings: [&[(&str, &str)]; 2] = [&[], &[("VRAMSHIM_POOL", "stitch-tight")]];
        for (i, env) in settings.iter().enumerate() {
            let mut e = device.to_vec();
            e.extend_from_slice(env);
            let mut a = args.to_vec();
            if i == 1 {
                a.push("--async");
            }
            let (o, hw) = pooled_run(&trace, None, &e, &a);
            assert_exit(&o, 0, &format!("{name} {env:?}"));
            assert_eq!(field(&o.stdout, "mismatches"), 0, "{name}");
            eprintln!(
                "{name} {env:?} {a:?}: high water {:.3} x peak live",
                hw as f64 / live as f64
            );
            assert!(
                hw >= live && hw <= bound(live),
                "{name} {env:?}: device high water {hw} B, peak live {live} B"
            );
        }
    }
    let t = trace_file("bert_serve.rmm.csv");
    let live = peak_live(&t);
    let (o, hw) = pooled_run(
        &t,
        None,
        &[
            ("VRAMSIM_MEMORY", "8GiB"),
            ("VRAMSHIM_POOL_DEBUG", "ignore-budget"),
        ],
        &args,
    );
    assert_eq!(o.code(), Some(0), "{}", o.stdout);
    assert!(
        hw > bound(live),
        "ignore-budget: high water {hw} B within the bound of peak live {live} B"
    );
}

#[test]
fn a_bad_pool_budget_warns_once_and_keeps_the_default_budget() {
    let t = trace_file("bert_serve.rmm.csv");
    let live = peak_live(&t);
    let (o, hw) = pooled_run(
        &t,
        None,
        &[("VRAMSIM_MEMORY", "8GiB"), ("VRAMSHIM_POOL_BUDGET", "lots")],
        &["--quiet"],
    );
    assert_exit(&o, 0, "");
    let lines: Vec<&str> = o
        .stderr
        .lines()
        .filter(|l| l.contains("VRAMSHIM_POOL_BUDGET"))
        .collect();
    assert_eq!(lines.len(), 1, "{}", o.stderr);
    assert!(
        lines[0].contains("0.05") && lines[0].contains("5%"),
        "{}",
        lines[0]
    );
    assert!(
        hw <= live + live / 10,
        "high water {hw} B, peak live {live} B"
    );
}

/// The pool's own statistics, read by the program (`vramshim_pool_stats` and
/// `vramshim_pool_stat`, found with `dlsym`) and written at exit (`pools` in
/// `VRAMSHIM_STATS`): with three blocks live the pool holds at least their bytes and at most
/// its budget, every field by name agrees with the array, an unknown name is -1; once they are
/// freed nothing is live and their bytes are cached or pending. Without the pool the functions
/// answer "no pool".
#[test]
fn pool_statistics_are_readable_in_process_and_at_exit() {
    let dir = vramshim_testkit::temp_dir("pool_stats");
    let exe = dir.join("pool_stats");
    vramshim_testkit::compile_c_to(
        &exe,
        &["tests/workloads/pool/pool_stats.c"],
        Link::SharedRuntime,
        &["-ldl"],
    );
    let json = dir.join("stats.json");
    let trace = dir.join("pool.vramtrace");
    let _ = std::fs::remove_file(&json);
    let _ = std::fs::remove_file(&trace);
    let o = run(
        &exe,
        &[],
        &[
            ("VRAMSHIM_POOL", "stitch-tight"),
            ("VRAMSHIM_STATS", json.to_str().unwrap()),
            ("VRAMSHIM_TRACE", trace.to_str().unwrap()),
        ],
        "pool-stats",
    );
    assert_exit(&o, 0, "");
    let line = |stage: &str| {
        o.stdout
            .lines()
            .find(|l| l.starts_with(&format!("pool_stats {stage} ")))
            .unwrap_or_else(|| panic!("no {stage} line in {}", o.stdout))
            .to_string()
    };
    let blocks = (5 << 20) + (3 << 20) + 512 + (7 << 20);
    let l = line("live");
    assert_eq!(field(&l, "n"), 18, "{l}");
    assert_eq!(field(&l, "live"), blocks, "{l}");
    let reserved = field(&l, "reserved");
    assert!(reserved >= blocks && reserved <= field(&l, "budget"), "{l}");
    assert_eq!(field(&l, "byname_reserved"), reserved, "{l}");
    assert_eq!(field(&l, "unknown"), -1, "{l}");
    let l = line("freed");
    assert_eq!(field(&l, "live"), 0, "{l}");
    assert_eq!(field(&l, "cached") + field(&l, "pending"), blocks, "{l}");
    let j = std::fs::read_to_string(&json).unwrap();
    assert!(j.contains("\"pools\":{\"0\":{\"reserved\":"), "{j}");
    assert!(j.contains("\"budget\":"), "{j}");
    // the trace: PoolStats records, the last (written at exit) with nothing live and the
    // three blocks' bytes cached or pending, under a budget
    let mut r = vramshim_trace::TraceReader::open(&trace).unwrap();
    let mut e = vramshim_trace::Event::Lost { t_ns: 0, count: 0 };
    let mut seen = Vec::new();
    while r.next_into(&mut e).unwrap() {
        if let vramshim_trace::Event::PoolStats {
            device,
            reserved,
            live,
            cached,
            pending,
            budget,
            ..
        } = e
        {
            assert_eq!(device, 0);
            seen.push((reserved, live, cached + pending, budget));
        }
    }
    let last = *seen.last().expect("no PoolStats record in the trace");
    assert_eq!((last.1, last.2), (0, blocks as u64), "{seen:?}");
    assert!(last.3 > 0 && last.0 <= last.3, "{seen:?}");
    // and the summary says it
    let text = summary(&trace, &[]);
    assert!(
        text.contains("pool on device 0 (last record): reserved") && text.contains("budget"),
        "{text}"
    );
    // the pool off: the functions are there and say so
    let o = run(&exe, &[], &[("VRAMSHIM_POOL", "off")], "pool-stats-off");
    assert_exit(&o, 0, "");
    assert!(o.stdout.contains("pool_stats: no pool"), "{}", o.stdout);
}

/// The pool's own synchronizations are in the trace as the pool's (`SyncKind::PoolDevice`),
/// one record per synchronization the pool made (its `syncs` statistic, at exit in
/// `VRAMSHIM_STATS`), and `vramshim summary` counts them: a `cudaMalloc`/`cudaFree` replay
/// makes the pool synchronize to release the freed blocks. Without the record (the wait view
/// not wired) the trace holds no pool synchronization and the test fails.
#[test]
fn the_pools_own_synchronizations_are_in_the_trace() {
    let dir = vramshim_testkit::temp_dir("pool_syncs");
    let json = dir.join("stats.json");
    let trace = dir.join("pool.vramtrace");
    let _ = std::fs::remove_file(&json);
    let _ = std::fs::remove_file(&trace);
    let (o, _) = pooled_run(
        &trace_file("vit_train.rmm.csv"),
        None,
        &[
            ("VRAMSHIM_STATS", json.to_str().unwrap()),
            ("VRAMSHIM_TRACE", trace.to_str().unwrap()),
        ],
        &["--quiet"],
    );
    assert_eq!(o.code(), Some(0), "{}\n{}", o.stdout, tail(&o.stderr));
    let j = std::fs::read_to_string(&json).unwrap();
    let pools = &j[j.find("\"pools\"").expect("no pools in the stats")..];
    let made: u64 = json_value(pools, "syncs").unwrap().parse().unwrap();
    assert!(made > 0, "the pool made no synchronization: {pools}");
    let mut r = vramshim_trace::TraceReader::open(&trace).unwrap();
    let mut e = vramshim_trace::Event::Lost { t_ns: 0, count: 0 };
    let (mut pool_device, mut process) = (0u64, 0u64);
    while r.next_into(&mut e).unwrap() {
        if let vramshim_trace::Event::Sync { kind, device, .. } = e {
            match kind {
                vramshim_trace::SyncKind::PoolDevice => {
                    assert_eq!(device, 0);
                    pool_device += 1;
                }
                vramshim_trace::SyncKind::PoolEvent => panic!("one stream: no event wait"),
                _ => process += 1,
            }
        }
    }
    assert_eq!(
        pool_device, made,
        "pool syncs in the trace vs the pool's count"
    );
    let text = summary(&trace, &["--json"]);
    assert_eq!(
        json_value(&text, "pool-device").and_then(|v| v.parse::<u64>().ok()),
        Some(made),
        "{text}"
    );
    let _ = process;
}

/// A block freed stream-ordered on one stream and reused on another makes the pool order the
/// second stream after an event recorded at the free (no host synchronization): the trace
/// records each such wait as the pool's (`SyncKind::PoolEvent`, on the waiting stream), and
/// `summary` counts them.
#[test]
fn the_pools_event_waits_are_in_the_trace() {
    let exe = compile_c(
        "pool_early_reuse",
        &["tests/workloads/pool/early_reuse.c"],
        Link::SharedRuntime,
    );
    let dir = vramshim_testkit::temp_dir("pool_event_waits");
    let trace = dir.join("pool.vramtrace");
    let _ = std::fs::remove_file(&trace);
    let o = run(
        &exe,
        &["async", "3"],
        &[
            ("VRAMSHIM_POOL", "stitch"),
            ("VRAMSHIM_TRACE", trace.to_str().unwrap()),
        ],
        "pool-event-waits",
    );
    assert_eq!(o.code(), Some(0), "{}\n{}", o.stdout, tail(&o.stderr));
    assert!(field(&o.stdout, "same_address") > 0, "{}", o.stdout);
    let mut r = vramshim_trace::TraceReader::open(&trace).unwrap();
    let mut e = vramshim_trace::Event::Lost { t_ns: 0, count: 0 };
    let mut waits = 0u64;
    while r.next_into(&mut e).unwrap() {
        if let vramshim_trace::Event::Sync {
            kind: vramshim_trace::SyncKind::PoolEvent,
            stream,
            ..
        } = e
        {
            assert_ne!(
                stream, 0,
                "the waiting stream is the program's second stream"
            );
            waits += 1;
        }
    }
    assert!(waits > 0, "no pool event wait in the trace");
    let vramshim = vramshim_testkit::vramshim_exe();
    let out = std::process::Command::new(&vramshim)
        .args(["summary", "--json"])
        .arg(&trace)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    assert_eq!(
        json_value(&text, "pool-event").and_then(|v| v.parse::<u64>().ok()),
        Some(waits),
        "{text}"
    );
}

/// A fork while another thread reads the pool's budget (inside its set-up): the child, where
/// that thread does not exist, reads it itself instead of waiting forever at its first pool.
#[test]
fn a_forked_child_reads_the_pool_budget_itself() {
    let (code, read) =
        crate::sys::setup::fork_during_setup(&super::BUDGET_READ, super::read_budget, || {
            // What the atfork child handler does.
            super::on_fork_child();
            // No VRAMSHIM_POOL_BUDGET here: the default budget.
            super::configured_budget()
                .is_some_and(|b| b.ratio == vramshim_pool::stitch::Budget::default().ratio)
                && super::BUDGET_READ.done() == Some(true)
        });
    assert!(read);
    assert_eq!(
        code,
        Some(0),
        "the forked child did not read the budget itself (None: it hung and was killed after 60 s)"
    );
}

/// Driver calls of `passes` passes of `trace` with stream-ordered frees through the tight
/// pool on the accounting device (the model the live pool must equal).
fn model_calls_stream_ordered(trace: &std::path::Path, passes: usize) -> u64 {
    use vramshim_pool::replay::{self, Frees};
    let t = vramshim_pool::rmm_csv::parse_file(trace).unwrap();
    let make =
        || -> Box<dyn vramshim_pool::Policy> { Box::new(vramshim_pool::stitch::Stitch::tight()) };
    replay::calls_per_pass_with(&t.events, Frees::StreamOrdered, &make, passes)
        .iter()
        .sum()
}

/// What `vramshim replay TRACE --pool stitch --json` predicts with every free stream-ordered
/// (its `same_frees` row "stream-ordered"): (driver calls, peak reserved bytes).
fn replay_stream_ordered(trace: &std::path::Path) -> (u64, u64) {
    let json = vramshim_replay_json(trace, &[]);
    let row = &json[json
        .find("\"stream-ordered\"")
        .expect("a stream-ordered row")..];
    let num = |k: &str| -> u64 { json_value(row, k).unwrap().parse().unwrap() };
    assert_eq!(json_value(row, "completed").as_deref(), Some("true"));
    (num("driver_calls"), num("peak_reserved"))
}

/// Issue 17, live with stream-ordered frees: the tight pool behind the threads' caches of
/// `cudaFreeAsync`d blocks makes exactly the model's driver calls, in one pass and in three
/// (a pass end, and t5's and vit's quiet points within a pass, are round ends only if the
/// caches give back what they keep when it is all that is live; and the pool decides as the
/// model only if it sees the caches' blocks before anything it serves, in free order, and
/// every free while it is above its budget). With the round ends not watched
/// (`VRAMSHIM_POOL_DEBUG=tcache-no-round-end`) the live pool leaves the model.
#[test]
fn tight_live_pool_with_thread_caches_makes_the_models_driver_calls() {
    let tight = [("VRAMSHIM_POOL", "stitch-tight")];
    let broken = [
        ("VRAMSHIM_POOL", "stitch-tight"),
        ("VRAMSHIM_POOL_DEBUG", "tcache-no-round-end"),
    ];
    let mut differs_broken = false;
    for trace in vramshim_testkit::shipped_traces() {
        let live = |env: &[(&str, &str)], n: u32| {
            let mut e = vec![("VRAMSIM_DEBUG", "1")];
            e.extend_from_slice(env);
            let n = n.to_string();
            let (o, _) = pooled_run(&trace, None, &e, &["--quiet", "--async", "--repeat", &n]);
            assert_eq!(o.code(), Some(0), "{}: {}", trace.display(), o.stdout);
            sim_memory_calls(&o.stderr)
        };
        let (m1, m3) = (
            model_calls_stream_ordered(&trace, 1),
            model_calls_stream_ordered(&trace, 3),
        );
        let (l1, l3) = (live(&tight, 1), live(&tight, 3));
        let (b1, b3) = (live(&broken, 1), live(&broken, 3));
        // what `vramshim replay` itself predicts for one pass, and the simulated device's
        // high-water mark against its peak reserved
        let (r1, r_peak) = replay_stream_ordered(&trace);
        let hw = {
            let e = [("VRAMSHIM_POOL", "stitch-tight")];
            let (o, hw) = pooled_run(&trace, None, &e, &["--quiet", "--async"]);
            assert_eq!(o.code(), Some(0), "{}: {}", trace.display(), o.stdout);
            hw
        };
        // without a budget (`VRAMSHIM_POOL_BUDGET=off`: no round ends, the caches keep
        // frees all the same)
        let unbudgeted = [("VRAMSHIM_POOL", "stitch"), ("VRAMSHIM_POOL_BUDGET", "off")];
        let u1 = live(&unbudgeted, 1);
        let um1 = {
            use vramshim_pool::replay::{self, Frees};
            let t = vramshim_pool::rmm_csv::parse_file(&trace).unwrap();
            let make = || -> Box<dyn vramshim_pool::Policy> {
                Box::new(vramshim_pool::stitch::Stitch::new())
            };
            replay::calls_per_pass_with(&t.events, Frees::StreamOrdered, &make, 1)[0]
        };
        eprintln!(
            "{} stitch-tight, stream-ordered: model {m1} / {m3}, live {l1} / {l3}, tcache-no-round-end {b1} / {b3}; vramshim replay {r1} calls, peak reserved {r_peak} B, live high-water {hw} B; no budget: model {um1}, live {u1}",
            trace.display()
        );
        assert_eq!(
            (l1, l3),
            (m1, m3),
            "{}: live driver calls in 1 / 3 passes against the model's",
            trace.display()
        );
        assert_eq!(l1, r1, "{}: live against vramshim replay", trace.display());
        assert!(
            r_peak.abs_diff(hw) <= 2 << 20,
            "{}: vramshim replay reserves {r_peak} B at its peak, the live pool {hw} B",
            trace.display()
        );
        assert_eq!(
            u1,
            um1,
            "{}: no budget, live against the model",
            trace.display()
        );
        differs_broken |= (b1, b3) != (m1, m3);
    }
    assert!(
        differs_broken,
        "tcache-no-round-end: the live pool still made the model's calls on every trace"
    );
}

/// A random repeated workload on one stream, as an RMM log the log-replay workload makes
/// `--repeat` times: one round of 60-200 events (allocations of seven sizes, frees of a random
/// live block, everything freed at its end), and how many times it is made (6-13).
fn random_round_log(seed: u64) -> (String, usize) {
    use std::fmt::Write;
    use vramshim_testkit::{RoundStep, XorShift};
    const MIB: u64 = 1 << 20;
    let sizes = [
        4096,
        100 << 10,
        MIB,
        3 * MIB + (300 << 10),
        7 * MIB,
        20 * MIB,
        45 * MIB,
    ];
    let mut r = XorShift::seeded(seed);
    let mut log = String::from("Thread,Time,Action,Pointer,Size,Stream\n");
    for step in vramshim_testkit::one_stream_round(&mut r, &sizes) {
        let (action, id, size) = match step {
            RoundStep::Alloc { id, size } => ("allocate", id, size),
            RoundStep::Free { id, size } => ("free", id, size),
        };
        let _ = writeln!(
            log,
            "1,00:00:00.000000,{action},{:#x},{size},0",
            0x1000_0000 + id * 0x1000
        );
    }
    (log, 6 + r.below(8) as usize)
}

/// Issue 17, the thread caches on repeated workloads: a cache's hit takes the block of that
/// size freed last, where the tight pool may have replayed another place, so a model with
/// every free reaching the pool is not what the live library does there; `vramshim replay`
/// runs the caches' rules as pure code (`vramshim_pool::thread_cache`) in front of the pool,
/// and predicts it. On 40 random one-stream repeated workloads, stream-ordered, the live
/// tight pool makes the driver calls `vramshim replay` predicts (and the mirror's, run here)
/// and peaks within a page of its peak reserved, on every one; the replay without the caches
/// (`Stitch::with_thread_caches(false)`) differs on some, so the test fails without them.
/// With the live caches off (`VRAMSHIM_POOL_DEBUG=no-tcache`) the live pool is that model
/// and leaves the prediction.
#[test]
fn tight_live_pool_makes_the_mirrored_thread_caches_driver_calls_on_repeated_rounds() {
    use vramshim_pool::replay::{self, Frees};
    let dir = vramshim_testkit::temp_dir("pool_random_rounds");
    let (mut model_differs, mut off_differs) = (0, 0);
    let n = 40;
    for seed in 0..n {
        let (log, repeats) = random_round_log(seed);
        let path = dir.join(format!("{seed}.csv"));
        std::fs::write(&path, &log).unwrap();
        // the same log made `repeats` times in one file, for `vramshim replay`
        let (head, rows) = log.split_once('\n').unwrap();
        let all = dir.join(format!("{seed}x{repeats}.csv"));
        std::fs::write(&all, format!("{head}\n{}", rows.repeat(repeats))).unwrap();
        let t = vramshim_pool::rmm_csv::parse_file(&path).unwrap();
        let events = Frees::StreamOrdered.apply(&replay::repeat(&t.events, repeats));
        let mirror = {
            let mut dev = vramshim_pool::AccountingDevice::new(replay::UNLIMITED);
            dev.set_checking(true);
            let mut p = vramshim_pool::stitch::Stitch::tight();
            vramshim_pool::thread_cache::run(&events, &mut p, &mut dev).unwrap();
            assert!(
                dev.violations().is_empty(),
                "{seed}: {:?}",
                dev.violations()
            );
            dev.calls().driver_calls()
        };
        let (predicted, predicted_peak) = replay_stream_ordered(&all);
        let model = {
            let mut dev = vramshim_pool::AccountingDevice::new(replay::UNLIMITED);
            let mut p = vramshim_pool::stitch::Stitch::tight().with_thread_caches(false);
            replay::run_with(&events, &mut p, &mut dev).driver_calls
        };
        let live = |debug: Option<&str>| {
            let mut env = vec![("VRAMSIM_DEBUG", "1"), ("VRAMSHIM_POOL", "stitch-tight")];
            env.extend(debug.map(|d| ("VRAMSHIM_POOL_DEBUG", d)));
            let r = repeats.to_string();
            let (o, hw) = pooled_run(&path, None, &env, &["--quiet", "--async", "--repeat", &r]);
            assert_eq!(o.code(), Some(0), "{seed}: {}", o.stdout);
            (sim_memory_calls(&o.stderr), hw)
        };
        let ((on, hw), (off, _)) = (live(None), live(Some("no-tcache")));
        eprintln!(
            "random round {seed} x{repeats}: vramshim replay {predicted} calls, peak reserved {predicted_peak} B; mirror {mirror}, without the caches {model}; live {on}, high-water {hw} B, live without caches {off}"
        );
        assert_eq!(
            on, predicted,
            "random round {seed} x{repeats}: live against vramshim replay's driver calls"
        );
        assert!(
            predicted_peak.abs_diff(hw) <= 2 << 20,
            "random round {seed} x{repeats}: vramshim replay reserves {predicted_peak} B at its peak, the live pool {hw} B"
        );
        assert_eq!(
            on, mirror,
            "random round {seed} x{repeats}: live against the mirrored caches"
        );
        model_differs += u32::from(model != on);
        off_differs += u32::from(off != on);
    }
    eprintln!(
        "of {n}: replay without the caches differs on {model_differs}, the live pool without caches on {off_differs}"
    );
    assert!(
        model_differs > 0,
        "the caches changed no driver call: the test shows nothing"
    );
    assert!(
        off_differs > 0,
        "no-tcache: the live pool still made the mirror's calls everywhere"
    );
}

/// The live pool with `VRAMSHIM_POOL_DEBUG=switch` (none if empty: the default) against its
/// model (`pool`, the tight pool with what `switch` turns on) on every shared trace, behind
/// `cudaFree` and stream-ordered:
/// memcpy patterns kept, the model's driver calls, the simulated device's high-water mark
/// within a page of the model's peak; and with `fault` instead some trace's patterns break.
/// Returns the blocks the models carved out of kept ranges.
fn live_pool_as_its_model(
    switch: &str,
    fault: &str,
    pool: fn() -> vramshim_pool::stitch::Stitch,
) -> u64 {
    use vramshim_pool::replay::{self, Frees};
    const PAGE: u64 = 2 << 20;
    let mut broken_caught = false;
    let mut carved = 0;
    for trace in vramshim_testkit::shipped_traces() {
        let name = trace.file_name().unwrap().to_string_lossy().into_owned();
        let t = vramshim_pool::rmm_csv::parse_file(&trace).unwrap();
        for frees in Frees::BOTH {
            let mut args = vec!["--pattern", "memcpy", "--quiet"];
            if frees == Frees::StreamOrdered {
                args.push("--async");
            }
            let mut env = vec![("VRAMSIM_DEBUG", "1")];
            if !switch.is_empty() {
                env.push(("VRAMSHIM_POOL_DEBUG", switch));
            }
            let (o, hw) = pooled_run(&trace, None, &env, &args);
            assert_exit(&o, 0, &format!("{name} {}", frees.name()));
            assert_eq!(field(&o.stdout, "mismatches"), 0, "{name}");
            let calls = sim_memory_calls(&o.stderr);
            let mut dev = vramshim_pool::AccountingDevice::new(replay::UNLIMITED);
            let mut p = pool();
            let r = replay::run_with(&frees.apply(&t.events), &mut p, &mut dev);
            assert!(r.completed, "{name}");
            let (model_calls, model_peak) = (r.driver_calls, r.peak_device_used);
            eprintln!(
                "{name} {}: {switch} ({} carves), driver calls model {model_calls}, live {calls}; peak model {model_peak} B, live {hw} B",
                frees.name(),
                p.kept_carves()
            );
            carved += p.kept_carves();
            assert_eq!(calls, model_calls, "{name} {}", frees.name());
            assert!(
                model_peak.abs_diff(hw) <= PAGE,
                "{name}: {model_peak} vs {hw}"
            );
            let env = [("VRAMSHIM_POOL_DEBUG", fault)];
            let (o, _) = pooled_run(&trace, None, &env, &args);
            let bad = o.code() != Some(0) || field(&o.stdout, "mismatches") > 0;
            eprintln!("{name} {}: {fault} broke it: {bad}", frees.name());
            broken_caught |= bad;
        }
    }
    assert!(broken_caught, "{fault}: every trace kept its patterns");
    carved
}

/// Handles of several pages live (`VRAMSHIM_POOL_DEBUG=runs`: the arena grows by runs, one
/// `cuMemCreate` and one `cuMemMap` each) make the model's driver calls with the model's
/// peak, patterns intact. With a page of a run mapped alone (`stitch-run-pages`: the driver
/// maps the handle's first page there, so two blocks share bytes) some trace's patterns break.
#[test]
fn live_pool_grows_by_runs_of_pages_as_the_model() {
    live_pool_as_its_model("runs", "stitch-run-pages", || {
        vramshim_pool::stitch::Stitch::tight().with_runs(true)
    });
}

/// Kept ranges live (`VRAMSHIM_POOL_DEBUG=kept`: smaller blocks carved best fit out of the
/// places large blocks had) make the model's driver calls with the model's peak, patterns
/// intact. With a carve that ignores a range's live blocks (`kept-over-live`: the new block
/// shares their bytes) some trace's patterns break.
#[test]
fn live_pool_carves_kept_ranges_as_the_model() {
    let carved = live_pool_as_its_model("kept", "kept-over-live", || {
        vramshim_pool::stitch::Stitch::tight().with_kept(true)
    });
    assert!(carved > 0, "no trace carved a block out of a kept range");
}

/// The layer replay live, as by default (a repeated sequence of large requests within one
/// round takes the places of two periods before; the thread caches keep only frees under a
/// page meanwhile) makes the model's driver calls with the model's peak, patterns intact. With
/// replayed places taken over live blocks (`layers-over-live`: the new block shares their
/// bytes) some trace's patterns break. Its off switch (`no-layers`, the thread caches kept)
/// makes the calls of the model without it on bert_serve, which differ from the default's.
#[test]
fn live_pool_replays_layers_as_the_model() {
    live_pool_as_its_model("", "layers-over-live", vramshim_pool::stitch::Stitch::tight);
    use vramshim_pool::replay::{self, Frees};
    let trace = vramshim_testkit::shipped_traces()
        .into_iter()
        .find(|t| t.to_string_lossy().contains("bert_serve"))
        .expect("bert_serve");
    let t = vramshim_pool::rmm_csv::parse_file(&trace).unwrap();
    for frees in Frees::BOTH {
        let mut args = vec!["--quiet"];
        if frees == Frees::StreamOrdered {
            args.push("--async");
        }
        let model = |layers: bool| {
            let mut dev = vramshim_pool::AccountingDevice::new(replay::UNLIMITED);
            let mut p = vramshim_pool::stitch::Stitch::tight().with_layers(layers);
            let r = replay::run_with(&frees.apply(&t.events), &mut p, &mut dev);
            assert!(r.completed);
            (r.driver_calls, p.layer_replays())
        };
        let ((on, replays), (off, none)) = (model(true), model(false));
        let env = [("VRAMSIM_DEBUG", "1"), ("VRAMSHIM_POOL_DEBUG", "no-layers")];
        let (o, _) = pooled_run(&trace, None, &env, &args);
        assert_exit(&o, 0, &format!("bert_serve {} no-layers", frees.name()));
        let live_off = sim_memory_calls(&o.stderr);
        eprintln!(
            "bert_serve {}: model {on} calls ({replays} layer replays), without layers {off} ({none}); live no-layers {live_off}",
            frees.name()
        );
        assert!(replays > 0 && none == 0 && on < off, "{}", frees.name());
        assert_eq!(live_off, off, "bert_serve {}: no-layers", frees.name());
    }
}

/// The model of `tests/workloads/pool/round_end.c` (the tight pool on the accounting device,
/// every free reaching it): its statistics after the last allocation, as the program prints
/// them.
fn round_end_model() -> String {
    use vramshim_pool::{ANY_STREAM, AccountingDevice, FreeMode, MIB, Policy, Request};
    let mut p = vramshim_pool::stitch::Stitch::tight();
    let mut dev = AccountingDevice::new(80 << 30);
    let anchor = p
        .alloc(
            &mut dev,
            Request {
                size: 256 << 10,
                stream: ANY_STREAM,
            },
        )
        .unwrap();
    for i in 0..300u64 {
        let size = (1 + i % 8) * MIB;
        let a = p
            .alloc(
                &mut dev,
                Request {
                    size,
                    stream: ANY_STREAM,
                },
            )
            .unwrap();
        p.free(&mut dev, a.addr, FreeMode::Sync).unwrap();
    }
    let (x, s) = (3 * MIB + 512, 7);
    let a = p.alloc(&mut dev, Request { size: x, stream: s }).unwrap();
    p.free(&mut dev, anchor.addr, FreeMode::Sync).unwrap();
    p.free(&mut dev, a.addr, FreeMode::Async { stream: s })
        .unwrap();
    p.alloc(&mut dev, Request { size: x, stream: s }).unwrap();
    let t = p.stats();
    format!(
        "round_end allocs={} frees={} cache_hits={} cached={} live={} reserved={} syncs={}",
        t.allocs, t.frees, t.cache_hits, t.cached, t.live, t.reserved, t.syncs
    )
}

/// A thread cache's first kept free can end the tight pool's round: 300 `cudaMalloc` /
/// `cudaFree` pairs beside a block live throughout (no cache keeps those frees, and no round
/// ends), then one block allocated stream-ordered, the long-lived one freed, the new one freed
/// stream-ordered (the first free any cache keeps, with nothing else live: the round's end)
/// and the same size again on that stream. The pool must end its round there as the model does (every free reaching it): same
/// allocations, cache hits, cached, live and reserved bytes, synchronizations. Missed (the
/// round watch unpublished at that free), the cache hands the block back itself and the pool
/// counts one allocation fewer and keeps the old round's cache.
#[test]
fn a_round_that_ends_at_the_first_kept_free_ends_as_in_the_model() {
    let exe = workload("round_end");
    let o = run(&exe, &[], &[("VRAMSHIM_POOL", "stitch")], "pool-round-end");
    assert_exit(&o, 0, "");
    let line = o
        .stdout
        .lines()
        .find(|l| l.starts_with("round_end allocs="))
        .unwrap_or_else(|| panic!("no statistics in {}", o.stdout));
    assert_eq!(
        line,
        round_end_model(),
        "live pool (left) against the model"
    );
}

/// A thread cache's blocks of one device do not count toward another device's round end:
/// device 0 has a block live (its round cannot end), the thread's cache keeps two 4 MiB
/// blocks of device 1 and then device 0's other block (1 MiB, less than device 0's live
/// bytes). Counted together (9 MiB against device 0's 1.25 MiB live), the caches would be
/// given back for nothing: device 1's pool would see its two frees. (The 4 MiB blocks are kept
/// only without the layer replay, `no-layers`: with it they reach device 1's pool at once.)
#[test]
fn a_devices_round_watch_counts_only_its_own_kept_blocks() {
    let exe = workload("kept_devices");
    let o = run(
        &exe,
        &[],
        &[
            ("VRAMSHIM_POOL", "stitch"),
            ("VRAMSIM_DEVICES", "2"),
            ("VRAMSHIM_POOL_DEBUG", "no-layers"),
        ],
        "pool-kept-devices",
    );
    assert_exit(&o, 0, "");
    let line = o
        .stdout
        .lines()
        .find(|l| l.starts_with("kept_devices frees0="))
        .unwrap_or_else(|| panic!("no statistics in {}", o.stdout));
    // device 0's pool saw the 300 cudaFree'd blocks only; device 1's none
    assert_eq!(line, "kept_devices frees0=300 frees1=0");
}

/// The model of `tests/workloads/pool/shrunk_loop.c` (the tight pool on the accounting device,
/// every free reaching it): reserved bytes and pages given back after the loop.
fn shrunk_loop_model() -> (u64, u64) {
    use vramshim_pool::{AccountingDevice, FreeMode, MIB, Policy, Request};
    let mut p = vramshim_pool::stitch::Stitch::tight();
    let mut dev = AccountingDevice::new(80 << 30);
    let (s, freed) = (7, FreeMode::Async { stream: 7 });
    let big: Vec<u64> = (0..64)
        .map(|_| {
            p.alloc(
                &mut dev,
                Request {
                    size: MIB,
                    stream: s,
                },
            )
            .unwrap()
            .addr
        })
        .collect();
    for a in big {
        p.free(&mut dev, a, freed).unwrap();
    }
    p.alloc(
        &mut dev,
        Request {
            size: 4096,
            stream: s,
        },
    )
    .unwrap();
    for i in 1..=3 * 65536u64 {
        let a = p
            .alloc(
                &mut dev,
                Request {
                    size: 8192,
                    stream: s,
                },
            )
            .unwrap();
        p.free(&mut dev, a.addr, freed).unwrap();
        if i % 1000 == 0 {
            p.note_process_sync();
        }
    }
    let t = p.stats();
    (t.reserved, t.releases)
}

/// A program whose use shrinks for good to one stream-ordered pair, which the thread's cache
/// serves whole, gets the pages of its old peak back as the model does (every free reaching
/// the pool): the caches count their hits into the pool, whose budget windows then end.
/// With the hits not counted (`VRAMSHIM_POOL_DEBUG=tcache-no-hits`) the pool keeps the 64 MiB
/// peak's pages.
#[test]
fn a_shrunk_loop_served_by_the_thread_cache_gets_the_old_peak_back() {
    let exe = workload("shrunk_loop");
    let (reserved, releases) = shrunk_loop_model();
    assert!(reserved < 8 << 20, "the model keeps {reserved} B");
    let live = |env: &[(&str, &str)], name| {
        let o = run(&exe, &[], env, name);
        assert_exit(&o, 0, name);
        (
            field(&o.stdout, "reserved") as u64,
            field(&o.stdout, "releases") as u64,
        )
    };
    let counted = live(&[("VRAMSHIM_POOL", "stitch")], "pool-shrunk-loop");
    let uncounted = live(
        &[
            ("VRAMSHIM_POOL", "stitch"),
            ("VRAMSHIM_POOL_DEBUG", "tcache-no-hits"),
        ],
        "pool-shrunk-loop-no-hits",
    );
    eprintln!(
        "model reserved {reserved} releases {releases}; live {counted:?}; hits not counted {uncounted:?}"
    );
    assert_eq!(
        counted,
        (reserved, releases),
        "live (left) against the model"
    );
    assert!(
        uncounted.0 >= 64 << 20,
        "tcache-no-hits: the pool still gave the old peak back: the test cannot fail"
    );
}

/// The model of `tests/workloads/pool/large_loop.c`: the tight pool on the accounting device
/// behind one thread's cache following `rules`; the two lines of statistics the program
/// prints (after the loop, at the end).
fn large_loop_model(rules: vramshim_pool::thread_cache::Rules) -> [String; 2] {
    use vramshim_pool::thread_cache::ThreadCache;
    use vramshim_pool::{AccountingDevice, FreeMode, MIB, Policy, Request};
    let mut p = vramshim_pool::stitch::Stitch::tight();
    let mut dev = AccountingDevice::new(80 << 30);
    let mut c = ThreadCache::new(rules);
    let (s, freed) = (7, FreeMode::Async { stream: 7 });
    let line = |p: &vramshim_pool::stitch::Stitch, when: &str| {
        let t = p.stats();
        format!(
            "large_loop {when} allocs={} frees={} cache_hits={} reserved={} peak_reserved={} mappings={}",
            t.allocs, t.frees, t.cache_hits, t.reserved, t.peak_reserved, t.mappings
        )
    };
    let alloc = |p: &mut vramshim_pool::stitch::Stitch,
                 dev: &mut AccountingDevice,
                 c: &mut ThreadCache,
                 size: u64| {
        let (a, _) = c.alloc(p, dev, Request { size, stream: s }).unwrap();
        (a.addr, size, a.size)
    };
    let free = |p: &mut vramshim_pool::stitch::Stitch,
                dev: &mut AccountingDevice,
                c: &mut ThreadCache,
                b: (u64, u64, u64)| {
        c.free(p, dev, b.0, b.1, b.2, freed).unwrap();
    };
    let _anchor = alloc(&mut p, &mut dev, &mut c, 4096);
    for _ in 0..125 {
        let four: Vec<_> = (0..4)
            .map(|_| alloc(&mut p, &mut dev, &mut c, 8 * MIB))
            .collect();
        for b in four {
            free(&mut p, &mut dev, &mut c, b);
        }
    }
    let after_loop = line(&p, "loop");
    let mut prev = None;
    for _ in 0..12 {
        let a = alloc(&mut p, &mut dev, &mut c, 6 * MIB);
        let b = alloc(&mut p, &mut dev, &mut c, 8 * MIB);
        for x in prev.into_iter().chain([a]) {
            free(&mut p, &mut dev, &mut c, x);
        }
        prev = Some(b);
    }
    [after_loop, line(&p, "end")]
}

/// A loop of one large size stream-ordered (longer than any period the layer replay looks
/// for), then layers of two sizes: the thread's cache keeps the loop's frees once the run is
/// long enough (`Policy::aside_run`, published with the pool's allocations) and serves most of
/// the loop, and the live pool's statistics after the loop and at the end are the model's
/// (the model's cache asks the pool itself). With `VRAMSHIM_POOL_DEBUG=tcache-no-run` (the
/// caches as before the rule) every allocation of the loop reaches the pool: the live pool
/// then leaves this model and matches the model of that rule instead.
#[test]
fn a_loop_of_one_large_size_is_served_by_the_thread_cache_as_in_the_model() {
    use vramshim_pool::thread_cache::Rules;
    let exe = workload("large_loop");
    let live = |env: &[(&str, &str)], name| {
        let o = run(&exe, &[], env, name);
        assert_exit(&o, 0, name);
        let lines: Vec<String> = o
            .stdout
            .lines()
            .filter(|l| l.starts_with("large_loop "))
            .map(str::to_string)
            .collect();
        assert_eq!(lines.len(), 2, "{}", o.stdout);
        [lines[0].clone(), lines[1].clone()]
    };
    let model = large_loop_model(Rules::LIVE);
    let model_before = large_loop_model(Rules {
        keep_run: false,
        ..Rules::LIVE
    });
    let on = live(&[("VRAMSHIM_POOL", "stitch")], "pool-large-loop");
    let off = live(
        &[
            ("VRAMSHIM_POOL", "stitch"),
            ("VRAMSHIM_POOL_DEBUG", "tcache-no-run"),
        ],
        "pool-large-loop-no-run",
    );
    eprintln!(
        "model {model:?}\nlive {on:?}\nmodel, no run kept {model_before:?}\nlive tcache-no-run {off:?}"
    );
    // the loop's 500 allocations and the anchor: most of the loop served by the cache
    assert!(
        field(&model[0], "allocs") < 200,
        "the model's cache served little of the loop: {}",
        model[0]
    );
    assert_eq!(field(&model_before[0], "allocs"), 501);
    assert_eq!(on, model, "live (left) against the model");
    assert_eq!(
        off, model_before,
        "tcache-no-run: live (left) against its model"
    );
    assert_ne!(
        off, model,
        "tcache-no-run: the live pool still made the model's statistics"
    );
}

/// `busy_maps` (tests/workloads/pool/busy_maps.c) on the pool's model: the same requests on
/// one stream, the process's waits for the stream at the same places, no device
/// synchronization. (most mappings after an allocation, mappings and pages at the end, the
/// pool's synchronizations, driver calls)
fn busy_maps_model(steps: u64, window: usize, wait: u64, old: bool) -> (u64, u64, u64, u64, u64) {
    let faults = vramshim_pool::stitch::Faults {
        busy_until_sync: old,
        ..Default::default()
    };
    let (r, _) = busy_maps_model_with(steps, (window, steps, window), wait, faults, false);
    r
}

/// [`busy_maps_model`] with the pool's `faults`, `(window, from this allocation on, shrunk
/// window)` as the workload's `WINDOW SHRINK_AT SHRUNK`, with the pool asking its streams'
/// events above its budget or not (`Stitch::with_event_settles`); also the most pages held
/// after an allocation.
fn busy_maps_model_with(
    steps: u64,
    (window, shrink_at, shrunk): (usize, u64, usize),
    wait: u64,
    faults: vramshim_pool::stitch::Faults,
    event_settles: bool,
) -> ((u64, u64, u64, u64, u64), u64) {
    use vramshim_pool::stitch::Stitch;
    use vramshim_pool::{AccountingDevice, Policy};
    let mut p = Stitch::tight().with_event_settles(event_settles);
    p.set_faults(faults);
    // cuda-sim's default device
    let mut dev = AccountingDevice::new(16 << 30);
    dev.set_checking(true);
    let run = vramshim_testkit::busy_maps::serve_shrinking(
        &mut p,
        &mut dev,
        steps,
        (window, shrink_at, shrunk),
        wait,
    );
    let (most, most_pages) = (run.most_mappings, run.most_pages);
    assert!(dev.violations().is_empty(), "{:?}", &dev.violations()[..1]);
    (
        (
            most,
            p.mappings(),
            p.pages(),
            p.stats().syncs,
            dev.calls().driver_calls(),
        ),
        most_pages,
    )
}

/// `busy_maps ARGS` live on the stitch pool with `VRAMSHIM_POOL_DEBUG=switch` (any name turns
/// the threads' caches off: every free reaches the pool at once), exiting 0: (most mappings,
/// mappings, pages, syncs, driver calls), as [`busy_maps_model`] returns them, and the most
/// pages held after an allocation.
fn busy_maps_live(
    exe: &std::path::Path,
    args: &[&str],
    switch: &str,
    name: &str,
) -> ((u64, u64, u64, u64, u64), u64) {
    let o = run(
        exe,
        args,
        &[
            ("VRAMSHIM_POOL", "stitch"),
            ("VRAMSHIM_POOL_DEBUG", switch),
            ("VRAMSIM_DEBUG", "1"),
            ("VRAMSHIM_CAP_CONTEXT", "exclude"),
            ("VRAMSIM_CONTEXT_OVERHEAD", "0"),
        ],
        name,
    );
    assert_exit(&o, 0, name);
    let n = |key| field(&o.stdout, key) as u64;
    (
        (
            n("most"),
            n("mappings"),
            n("pages"),
            n("syncs"),
            sim_memory_calls(&o.stderr),
        ),
        n("most_pages"),
    )
}

/// A serving process that never synchronizes the device (it waits for its stream only) keeps
/// its mappings near the cleanup limit (2 per page + 64) live as in the model: the pool asks
/// the stream's events, which cuda-sim completes when the stream passes them (the workload
/// holds its stream until each wait, so they complete at the waits, as in the model). The
/// mappings, pages, synchronizations (none) and driver calls equal the model's. With the old
/// rule (`VRAMSHIM_POOL_DEBUG=busy-until-sync`: busy until a synchronization) the mappings
/// pile up past the limit, live as in the model.
#[test]
fn mappings_freed_through_stay_bounded_live_without_a_synchronization() {
    let exe = workload("busy_maps");
    let (steps, window, wait) = (20_000u64, 8usize, 64u64);
    let args = [steps.to_string(), window.to_string(), wait.to_string()];
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    for (old, switch) in [(false, "no-tcache"), (true, "busy-until-sync")] {
        let (most, maps, pages, syncs, calls) = busy_maps_model(steps, window, wait, old);
        let (live, _) = busy_maps_live(&exe, &args, switch, &format!("pool-busy-maps-{switch}"));
        let limit = 2 * pages + 64;
        eprintln!(
            "{switch}: model (most, mappings, pages, syncs, driver calls) {:?}, live {live:?}, limit {limit}",
            (most, maps, pages, syncs, calls)
        );
        assert_eq!(
            live,
            (most, maps, pages, syncs, calls),
            "{switch}: live (left) against the model"
        );
        assert_eq!(syncs, 0);
        if old {
            assert!(most > limit, "{most} mappings, limit {limit}: no pile-up");
        } else {
            assert!(most <= limit + 1, "{most} mappings, limit {limit}");
        }
    }
}

/// Pages of dissolved stream-ordered bytes go back under the budget without a device
/// synchronization, live as in the model: `busy_maps` with its live bytes shrinking (8 blocks
/// live, then 2 from allocation 60,000 on; 140,000 allocations, so that the default budget's
/// 65,536-allocation windows roll past the shrink), the process waiting for its stream only.
/// The events the pool records on the stream end the page fences as they end busy mappings;
/// with the fences kept until a synchronization (`VRAMSHIM_POOL_DEBUG=fences-until-sync`) the
/// pool holds more pages at the end, live as in the model.
#[test]
fn pages_of_dissolved_stream_ordered_bytes_go_back_live_without_a_synchronization() {
    let exe = workload("busy_maps");
    let (steps, window, wait, shrink_at, shrunk) = (140_000u64, 8usize, 64u64, 60_000u64, 2usize);
    let args = [steps, window as u64, wait, shrink_at, shrunk as u64].map(|v| v.to_string());
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut pages_at_end = Vec::new();
    for (old, switch) in [
        (false, "event-settles"),
        (true, "event-settles,fences-until-sync"),
    ] {
        let faults = vramshim_pool::stitch::Faults {
            fences_until_sync: old,
            ..Default::default()
        };
        let (model, most_pages) =
            busy_maps_model_with(steps, (window, shrink_at, shrunk), wait, faults, true);
        let (live, live_most_pages) =
            busy_maps_live(&exe, &args, switch, &format!("pool-busy-pages-{switch}"));
        eprintln!(
            "{switch}: model (most mappings, mappings, pages, syncs, driver calls) {model:?}, most pages {most_pages}; live {live:?}, most pages {live_most_pages}"
        );
        assert_eq!(live, model, "{switch}: live (left) against the model");
        assert_eq!(live_most_pages, most_pages, "{switch}: most pages");
        assert_eq!(model.3, 0, "the pool synchronized");
        pages_at_end.push(model.2);
    }
    assert!(
        pages_at_end[0] + 16 <= pages_at_end[1],
        "pages at the end: {} with the events, {} with fences until a sync",
        pages_at_end[0],
        pages_at_end[1]
    );
}

/// `vramshim replay` keys a recorded allocation and a stream-ordered free on the stream the
/// live pool does (`vramshim_pool::streams`): any stream for `cudaMalloc`, handle 0's stream
/// for `cudaStreamLegacy`, the thread's own for `cudaStreamPerThread` and the `_ptsz` entry
/// points' handle 0. On a traced run mixing them (`mixed_streams`), its predicted driver calls
/// and synchronizations are the live pool's. (Keyed by the recorded handles, it served a
/// `cudaMalloc` at once from a block freed on stream 0, which the live pool never does
/// without a synchronization: 31 driver calls and no synchronization predicted, against 34
/// and 38 live.)
#[test]
fn vramshim_replay_keys_streams_as_the_live_pool_on_a_mixed_trace() {
    let exe = workload("mixed_streams");
    let dir = vramshim_testkit::temp_dir("pool_mixed_streams");
    let trace = dir.join("mixed.vramtrace");
    let _ = std::fs::remove_file(&trace);
    let o = run(
        &exe,
        &["6"],
        &[
            ("VRAMSHIM_POOL", "stitch"),
            ("VRAMSHIM_TRACE", trace.to_str().unwrap()),
            ("VRAMSIM_DEBUG", "1"),
        ],
        "pool-mixed-streams",
    );
    assert_exit(&o, 0, "mixed_streams");
    let (live_calls, live_syncs) = (
        sim_memory_calls(&o.stderr),
        field(&o.stdout, "syncs") as u64,
    );
    let json = vramshim_replay_json(&trace, &[]);
    let policies = &json[json.find("\"policies\"").unwrap()..];
    let num = |k: &str| -> u64 { json_value(policies, k).unwrap().parse().unwrap() };
    let (model_calls, model_syncs) = (num("driver_calls"), num("syncs"));
    eprintln!(
        "mixed_streams: driver calls replay {model_calls}, live {live_calls}; syncs replay {model_syncs}, live {live_syncs}"
    );
    assert!(live_calls > 0);
    assert_eq!(
        (model_calls, model_syncs),
        (live_calls, live_syncs),
        "vramshim replay (left) against the live pool: (driver calls, syncs)"
    );
}
