//! Plan review: the semantic diff of a one-layer cut move reads without opening the plans, and
//! the rendered picture shows ranks, runs, islands with their reasons, boundaries and
//! all-reduces. `render` and `diff` know a plan by its content, whatever its file name.

use memra_compiler::passes::compile;
use memra_compiler::plan::Plan;
use memra_compiler::review::{semantic_diff, to_dot};
use std::path::Path;
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};

static SCRATCH: AtomicUsize = AtomicUsize::new(0);

fn compile_with(name: &str, edit: impl Fn(String) -> String) -> Plan {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../plans");
    let text = edit(std::fs::read_to_string(dir.join(name)).unwrap());
    let n = SCRATCH.fetch_add(1, Ordering::Relaxed);
    let path = dir.join(format!(".test-review-{}-{n}-{name}", std::process::id()));
    std::fs::write(&path, text).unwrap();
    let plan = compile(&path);
    std::fs::remove_file(&path).unwrap();
    plan.unwrap_or_else(|e| panic!("{e}")).plan
}

#[test]
fn moving_a_cut_by_one_layer_reads_as_one_moved_layer() {
    let old = compile_with("llama3-8b-pp4.toml", |t| t);
    let new = compile_with("llama3-8b-pp4.toml", |t| {
        t.replace("[pipeline]", "[pipeline]\ncuts = [9, 16, 24]")
    });
    let expected = "\
plan:
  placement hash: 799ea935e25e8d3f -> 6ad27787a8c26e73
layers:
  layer 8 moved: rank 1 (stage 1, device 1) -> rank 0 (stage 0, device 0)
programs:
  rank 0:
    - run r0.run0 (2 phases): embed, layers 0..8: attn_pre attn_core attn_out ffn, store_hidden
    + run r0.run0 (2 phases): embed, layers 0..9: attn_pre attn_core attn_out ffn, store_hidden
  rank 1:
    - run r1.run0 (2 phases): load_hidden, layers 8..16: attn_pre attn_core attn_out ffn, store_hidden
    + run r1.run0 (2 phases): load_hidden, layers 9..16: attn_pre attn_core attn_out ffn, store_hidden
bytes per device:
  device 0: 3103.4 MiB -> 3361.4 MiB (+258.0 MiB; weights +130.0 MiB, kv +128.0 MiB, buffers +0.0 MiB)
  device 1: 2806.3 MiB -> 2548.2 MiB (-258.0 MiB; weights -130.0 MiB, kv -128.0 MiB, buffers +0.0 MiB)
";
    assert_eq!(semantic_diff(&old, &new), expected);
    assert_eq!(semantic_diff(&old, &old), "");
}

#[test]
fn an_island_appears_with_its_reason_and_a_transport_change_shows() {
    let old = compile_with("llama3-8b-pp2-tp2.toml", |t| t);
    let new = compile_with("llama3-8b-pp2-tp2.toml", |t| {
        t.replace("[[0, 1], [2, 3]]", "[[0, 1], [0, 1]]")
            + "\n[[capture.eager]]\nlayers = [20, 21]\nreason = \"nan hunt\"\n"
    });
    let diff = semantic_diff(&old, &new);
    for needle in [
        "rank 2 moved: device 2 -> 0",
        "rank 2: runs split (1 -> 2) islands 0 -> 1",
        "+ island r2.island0 (forced: nan hunt): layers 20..22: attn_pre attn_core attn_out all_reduce ffn all_reduce",
        "- b0 hidden rank 0 -> rank 2, peer_copy, 2 slots of 512 token rows, lag 0",
        "+ b0 hidden rank 0 -> rank 2, device_copy, 2 slots of 512 token rows, lag 0",
    ] {
        assert!(diff.contains(needle), "missing `{needle}` in:\n{diff}");
    }
}

#[test]
fn the_picture_shows_clusters_islands_boundaries_and_all_reduces() {
    let plan = compile_with("llama3-8b-pp2-tp2.toml", |t| {
        t + "\n[[capture.eager]]\nlayers = [20, 21]\nreason = \"nan hunt\"\n"
    });
    let dot = to_dot(&plan);
    for needle in [
        "subgraph cluster_r0",
        "subgraph cluster_r3",
        "label=\"rank 2 · stage 1 · device 2 · tp 0/2 · layers 16..32\"",
        "eager island r2.island0\\lwhy: forced: nan hunt",
        "r0s4 -> r2s1 [label=\"b0 hidden · peer_copy · 2 slots\"",
        "label=\"all_reduce (r0 r1)\"",
    ] {
        assert!(dot.contains(needle), "missing `{needle}` in:\n{dot}");
    }
}

#[test]
fn a_plan_under_another_name_renders_and_diffs_as_a_plan() {
    let committed = Path::new(env!("CARGO_MANIFEST_DIR")).join("../plans/llama3-8b-pp4.plan.toml");
    let dir = std::env::temp_dir().join(format!("memra-review-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let renamed = dir.join("a.plan");
    std::fs::copy(&committed, &renamed).unwrap();
    let compile = |args: &[&std::ffi::OsStr]| {
        let out = Command::new(env!("CARGO_BIN_EXE_memra-compile"))
            .args(args)
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout).to_string();
        let err = String::from_utf8_lossy(&out.stderr).to_string();
        (out.status.code(), text, err)
    };
    let dot = dir.join("a.dot");
    let (code, _, err) = compile(&[
        "render".as_ref(),
        renamed.as_os_str(),
        "--format".as_ref(),
        "dot".as_ref(),
        "-o".as_ref(),
        dot.as_os_str(),
    ]);
    assert_eq!(code, Some(0), "{err}");
    let picture = std::fs::read_to_string(&dot).unwrap();
    assert!(picture.contains("subgraph cluster_r3"), "{picture}");
    let (code, text, err) = compile(&["diff".as_ref(), renamed.as_os_str(), committed.as_os_str()]);
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(text, "plans are identical\n");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn an_output_over_an_input_or_a_users_file_is_refused_and_leaves_it_whole() {
    let plans = Path::new(env!("CARGO_MANIFEST_DIR")).join("../plans");
    let dir = std::env::temp_dir().join(format!("memra-clobber-{}", std::process::id()));
    std::fs::create_dir_all(dir.join("models")).unwrap();
    let placement = dir.join("p.toml");
    std::fs::copy(plans.join("llama3-8b-pp4.toml"), &placement).unwrap();
    let model = dir.join("models/llama-3-8b.json");
    std::fs::copy(plans.join("models/llama-3-8b.json"), &model).unwrap();
    let other = dir.join("other.toml");
    std::fs::write(&other, "# someone's notes\n").unwrap();
    let run = |args: &[&std::ffi::OsStr]| {
        let out = Command::new(env!("CARGO_BIN_EXE_memra-compile"))
            .args(args)
            .output()
            .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).to_string(),
        )
    };
    let before: Vec<Vec<u8>> = [&placement, &model, &other]
        .iter()
        .map(|p| std::fs::read(p).unwrap())
        .collect();
    let (o, fmt, dot) = ("-o".as_ref(), "--format".as_ref(), "dot".as_ref());
    for (args, want) in [
        (
            vec![placement.as_os_str(), o, placement.as_os_str()],
            "is the placement this reads",
        ),
        (
            vec![placement.as_os_str(), o, model.as_os_str()],
            "is the model this reads",
        ),
        (
            vec![placement.as_os_str(), o, other.as_os_str()],
            "exists and is not a file this command writes",
        ),
        (
            vec![
                "render".as_ref(),
                placement.as_os_str(),
                fmt,
                dot,
                o,
                placement.as_os_str(),
            ],
            "is the plan or placement this reads",
        ),
        (
            vec![
                "render".as_ref(),
                placement.as_os_str(),
                fmt,
                dot,
                o,
                other.as_os_str(),
            ],
            "exists and is not a file this command writes",
        ),
    ] {
        let (code, err) = run(&args);
        assert_eq!(code, Some(1), "{args:?}: {err}");
        assert!(err.contains(want), "{args:?}: {err}");
    }
    for (path, was) in [&placement, &model, &other].iter().zip(&before) {
        assert_eq!(&std::fs::read(path).unwrap(), was, "{}", path.display());
    }
    // What the commands write themselves they replace, as before.
    let written = dir.join("p.plan.toml");
    for _ in 0..2 {
        let (code, err) = run(&[placement.as_os_str(), "-q".as_ref()]);
        assert_eq!(code, Some(0), "{err}");
        let (code, err) = run(&["render".as_ref(), written.as_os_str(), fmt, dot]);
        assert_eq!(code, Some(0), "{err}");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_plan_written_into_another_folder_names_its_model_from_there() {
    // the plan kept the placement's `source`, relative to the placement's folder, so a plan
    // written elsewhere named a file that is not there
    let plans = Path::new(env!("CARGO_MANIFEST_DIR")).join("../plans");
    let dir = std::env::temp_dir().join(format!("memra-elsewhere-{}", std::process::id()));
    let nested = dir.join("a/b");
    std::fs::create_dir_all(&nested).unwrap();
    for (placement, out) in [
        ("llama3-8b-pp4.toml", nested.join("pp4.plan.toml")),
        ("llama3-8b-tp2.toml", dir.join("tp2.plan.toml")),
    ] {
        let run = Command::new(env!("CARGO_BIN_EXE_memra-compile"))
            .arg(plans.join(placement))
            .arg("-o")
            .arg(&out)
            .arg("-q")
            .output()
            .unwrap();
        assert!(
            run.status.success(),
            "{}",
            String::from_utf8_lossy(&run.stderr)
        );
        let plan = Plan::from_toml(&std::fs::read_to_string(&out).unwrap()).unwrap();
        let named = out.parent().unwrap().join(&plan.model.source);
        let committed = Plan::from_toml(
            &std::fs::read_to_string(plans.join(placement.replace(".toml", ".plan.toml"))).unwrap(),
        )
        .unwrap();
        assert_eq!(
            std::fs::canonicalize(&named).unwrap(),
            std::fs::canonicalize(plans.join(&committed.model.source)).unwrap(),
            "{placement}: {}",
            plan.model.source
        );
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A fresh, empty folder for `tag` (under the system's temporary folder).
fn scratch(tag: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("memra-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).map(|()| dir).unwrap()
}

/// How many files `dir` holds (no temporary file left behind: only the ones written).
fn files_in(dir: &Path) -> usize {
    std::fs::read_dir(dir).unwrap().count()
}

#[test]
fn render_without_graphviz_writes_dot_text_and_says_how_to_draw_it() {
    let plans = Path::new(env!("CARGO_MANIFEST_DIR")).join("../plans");
    let dir = scratch("render-nodot");
    let plan = dir.join("pp4.plan.toml");
    std::fs::copy(plans.join("llama3-8b-pp4.plan.toml"), &plan).unwrap();
    // an empty PATH: no graphviz `dot`, whatever this machine has installed
    let render = |args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_memra-compile"))
            .env("PATH", &dir)
            .arg("render")
            .arg(&plan)
            .args(args)
            .output()
            .unwrap()
    };
    let out = render(&[]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{err}");
    let dot = dir.join("pp4.dot");
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        format!("{}\n", dot.display())
    );
    assert_eq!(
        err,
        format!(
            "note: graphviz's `dot` is not installed, so this wrote DOT text, not SVG, to {}; draw it with `dot -Tsvg {} -o {}` once graphviz is installed\n",
            dot.display(),
            dot.display(),
            dir.join("pp4.svg").display()
        )
    );
    assert!(std::fs::read_to_string(&dot)
        .unwrap()
        .starts_with("digraph"));
    // SVG asked for by name is not replaced by something else: a clear error, nothing written
    for args in [&["--format", "svg"][..], &["-o", "x.png"]] {
        let out = render(args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {err}");
        assert!(
            err.starts_with("error: graphviz's `dot` is needed for ")
                && err.ends_with(
                    " output and is not installed; install graphviz, or use --format dot for DOT text\n"
                ),
            "{args:?}: {err}"
        );
    }
    assert_eq!(files_in(&dir), 2, "pp4.plan.toml and pp4.dot");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_plan_write_cut_short_by_a_file_size_limit_leaves_the_old_plan_whole() {
    let plans = Path::new(env!("CARGO_MANIFEST_DIR")).join("../plans");
    let dir = scratch("fsize");
    let out = dir.join("out.plan.toml");
    // a good plan under the name, and a placement whose plan (70 kB) is past a 10 kB limit
    let old = std::fs::read(plans.join("smollm2.plan.toml")).unwrap();
    std::fs::write(&out, &old).unwrap();
    let compile = |limited: bool| {
        // the signal ignored, the limit reaches the write as an error (EFBIG), as a full disk
        let limit = if limited {
            "trap '' XFSZ; ulimit -f 10; "
        } else {
            ""
        };
        Command::new("sh")
            .arg("-c")
            .arg(format!("{limit}exec \"$0\" \"$@\""))
            .arg(env!("CARGO_BIN_EXE_memra-compile"))
            .arg(plans.join("llama3-8b-tp2.toml"))
            .arg("-q")
            .arg("-o")
            .arg(&out)
            .output()
            .unwrap()
    };
    let failed = compile(true);
    let err = String::from_utf8_lossy(&failed.stderr);
    assert_eq!(failed.status.code(), Some(1), "{err}");
    assert!(
        err.starts_with(&format!("error: {}: cannot write: ", out.display())),
        "{err}"
    );
    assert!(std::fs::read(&out).unwrap() == old, "the old plan changed");
    assert_eq!(files_in(&dir), 1, "out.plan.toml");
    // without the limit the same command replaces it whole
    let done = compile(false);
    assert!(
        done.status.success(),
        "{}",
        String::from_utf8_lossy(&done.stderr)
    );
    let new = std::fs::read_to_string(&out).unwrap();
    assert!(new.len() > 10 << 10 && Plan::from_toml(&new).is_ok());
    assert_eq!(files_in(&dir), 1, "out.plan.toml");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_plan_given_to_memra_compile_is_named_as_one_with_the_commands_that_take_it() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let out = Command::new(env!("CARGO_BIN_EXE_memra-compile"))
        .current_dir(&root)
        .arg("plans/llama3-8b-tp2.plan.toml")
        .arg("-o")
        .arg(std::env::temp_dir().join("memra-should-not-exist.plan.toml"))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(
        String::from_utf8_lossy(&out.stderr),
        "error: plans/llama3-8b-tp2.plan.toml:1:1: format_version: this file is an execution plan written by memra-compile, not a placement; memra-run takes it (memra-run generate plans/llama3-8b-tp2.plan.toml --prompt TEXT), and memra-compile takes its placement: memra-compile plans/llama3-8b-tp2.toml\n"
    );
}

#[test]
fn the_summary_says_apart_what_only_a_cuda_run_takes() {
    let plans = Path::new(env!("CARGO_MANIFEST_DIR")).join("../plans");
    let dir = scratch("summary");
    let out = Command::new(env!("CARGO_BIN_EXE_memra-compile"))
        .arg(plans.join("llama3-8b-pp2-tp2.toml"))
        .arg("-o")
        .arg(dir.join("p.plan.toml"))
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let devices: Vec<&str> = text.lines().filter(|l| l.starts_with("device ")).collect();
    assert_eq!(devices.len(), 4, "{text}");
    for line in devices {
        let (any, cuda) = line.split_once("; on cuda ").expect(line);
        assert!(!any.contains("cuda") && !any.contains("runtime"), "{line}");
        assert!(
            cuda.contains(" with the cuda runtime's 531.0 MiB"),
            "{line}"
        );
    }
    assert!(!text.lines().next().unwrap().contains("capture"), "{text}");
    assert!(text.ends_with("\non cuda: capture graphs\n"), "{text}");
    std::fs::remove_dir_all(&dir).unwrap();
}
