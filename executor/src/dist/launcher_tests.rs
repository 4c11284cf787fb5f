//! The launcher variables: each launcher's set, the innermost winning, flags over the
//! environment, every partial or conflicting set refused by name, and SLURM's node lists.

use super::*;

fn env(pairs: &[(&'static str, &str)]) -> Env {
    Env::from_os(pairs.iter().map(|&(n, v)| (n, Some(OsString::from(v))))).unwrap()
}

fn assigned(pairs: &[(&'static str, &str)], flags: &Flags) -> Assignment {
    assign(&env(pairs), flags)
        .unwrap_or_else(|e| panic!("{e:#}"))
        .expect("a world")
}

fn refused(pairs: &[(&'static str, &str)], flags: &Flags) -> String {
    match assign(&env(pairs), flags) {
        Ok(a) => panic!("accepted: {a:?}"),
        Err(e) => format!("{e:#}"),
    }
}

const NO_FLAGS: Flags = Flags {
    process: None,
    processes: None,
    rendezvous: None,
    port: None,
};

#[test]
fn no_launcher_and_no_flags_is_no_world() {
    assert_eq!(assign(&Env::default(), &NO_FLAGS).unwrap(), None);
    // variables of no launcher's rank or size are not a launch
    assert_eq!(
        assign(
            &env(&[("MASTER_ADDR", "a"), ("SLURM_JOB_NODELIST", "n1")]),
            &NO_FLAGS
        )
        .unwrap(),
        None
    );
}

#[test]
fn slurm_meets_at_the_first_host_of_the_step() {
    let a = assigned(
        &[
            ("SLURM_PROCID", "2"),
            ("SLURM_NTASKS", "4"),
            ("SLURM_LOCALID", "0"),
            ("SLURM_STEP_NODELIST", "node[03-05,07]"),
            ("SLURM_JOB_NODELIST", "other[1-9]"),
        ],
        &NO_FLAGS,
    );
    assert_eq!(a.launcher, Some(Launcher::Slurm));
    assert_eq!((a.process, a.processes), (2, 4));
    assert_eq!(a.rendezvous, "node03:29500");
    assert_eq!(a.sources.join(", "), "SLURM_PROCID=2, SLURM_NTASKS=4, local rank 0 from SLURM_LOCALID, rendezvous node03:29500 from the first host of SLURM_STEP_NODELIST and the default port");
    // the job's list without the step's; MASTER_ADDR and MASTER_PORT over both
    let job = [
        ("SLURM_PROCID", "0"),
        ("SLURM_NTASKS", "2"),
        ("SLURM_JOB_NODELIST", "gpu7,gpu9"),
    ];
    assert_eq!(assigned(&job, &NO_FLAGS).rendezvous, "gpu7:29500");
    let master = [
        &job[..],
        &[("MASTER_ADDR", "10.0.0.5"), ("MASTER_PORT", "4000")],
    ]
    .concat();
    assert_eq!(assigned(&master, &NO_FLAGS).rendezvous, "10.0.0.5:4000");
    let port = [&job[..], &[("MASTER_PORT", "4000")]].concat();
    assert_eq!(assigned(&port, &NO_FLAGS).rendezvous, "gpu7:4000");
}

#[test]
fn open_mpi_pmi_and_torchrun() {
    let ompi = assigned(
        &[
            ("OMPI_COMM_WORLD_RANK", "3"),
            ("OMPI_COMM_WORLD_SIZE", "4"),
            ("OMPI_COMM_WORLD_LOCAL_RANK", "1"),
            ("PMIX_RANK", "3"),
            ("MASTER_ADDR", "head"),
        ],
        &NO_FLAGS,
    );
    assert_eq!(ompi.launcher, Some(Launcher::OpenMpi));
    assert_eq!((ompi.process, ompi.processes), (3, 4));
    assert_eq!(ompi.rendezvous, "head:29500");
    let pmi = assigned(
        &[("PMI_RANK", "1"), ("PMI_SIZE", "2"), ("MASTER_ADDR", "h")],
        &NO_FLAGS,
    );
    assert_eq!(pmi.launcher, Some(Launcher::Pmi));
    assert_eq!((pmi.process, pmi.processes), (1, 2));
    let torch = assigned(
        &[
            ("RANK", "1"),
            ("WORLD_SIZE", "2"),
            ("LOCAL_RANK", "1"),
            ("MASTER_ADDR", "127.0.0.1"),
            ("MASTER_PORT", "29400"),
        ],
        &NO_FLAGS,
    );
    assert_eq!(torch.launcher, Some(Launcher::Torchrun));
    assert_eq!(torch.rendezvous, "127.0.0.1:29400");
}

#[test]
fn a_world_of_one_needs_no_rendezvous() {
    let a = assigned(
        &[("OMPI_COMM_WORLD_RANK", "0"), ("OMPI_COMM_WORLD_SIZE", "1")],
        &NO_FLAGS,
    );
    assert_eq!((a.process, a.processes), (0, 1));
    assert_eq!(a.rendezvous, ALONE);
    assert_eq!(a.sources[2], "no rendezvous for one process");
}

#[test]
fn the_innermost_launcher_wins() {
    // mpirun inside an sbatch script: the batch step's SLURM_PROCID is 0 in every rank
    let a = assigned(
        &[
            ("SLURM_PROCID", "0"),
            ("SLURM_NTASKS", "1"),
            ("SLURM_JOB_NODELIST", "n[1-2]"),
            ("OMPI_COMM_WORLD_RANK", "1"),
            ("OMPI_COMM_WORLD_SIZE", "2"),
            ("MASTER_ADDR", "n1"),
        ],
        &NO_FLAGS,
    );
    assert_eq!(a.launcher, Some(Launcher::OpenMpi));
    assert_eq!((a.process, a.processes), (1, 2));
    // torchrun under srun: the worker's RANK, not the node's task
    let t = assigned(
        &[
            ("SLURM_PROCID", "1"),
            ("SLURM_NTASKS", "2"),
            ("PMIX_RANK", "1"),
            ("RANK", "5"),
            ("WORLD_SIZE", "8"),
            ("MASTER_ADDR", "n1"),
            ("MASTER_PORT", "29400"),
        ],
        &NO_FLAGS,
    );
    assert_eq!(
        (t.launcher, t.process, t.processes),
        (Some(Launcher::Torchrun), 5, 8)
    );
}

#[test]
fn flags_win_over_the_environment() {
    let slurm = [
        ("SLURM_PROCID", "1"),
        ("SLURM_NTASKS", "4"),
        ("SLURM_STEP_NODELIST", "node[03-05,07]"),
    ];
    let flags = Flags {
        rendezvous: Some("10.1.1.1:7000".into()),
        ..NO_FLAGS
    };
    let a = assigned(&slurm, &flags);
    assert_eq!((a.process, a.processes), (1, 4));
    assert_eq!(a.rendezvous, "10.1.1.1:7000");
    assert_eq!(a.sources[2], "rendezvous 10.1.1.1:7000 from --rendezvous");
    let flags = Flags {
        process: Some(2),
        port: Some(7001),
        ..NO_FLAGS
    };
    let a = assigned(&slurm, &flags);
    assert_eq!((a.process, a.processes), (2, 4));
    assert_eq!(a.rendezvous, "node03:7001");
    assert_eq!(
        a.sources[..2],
        ["--process 2 over SLURM_PROCID=1", "SLURM_NTASKS=4"]
    );
    // the flags alone, as on the subcommands
    let alone = Flags {
        process: Some(0),
        processes: Some(2),
        rendezvous: Some("127.0.0.1:0".into()),
        port: None,
    };
    let a = assigned(&[], &alone);
    assert_eq!((a.launcher, a.process, a.processes), (None, 0, 2));
}

#[test]
fn partial_environments_are_refused_by_name() {
    let e = refused(&[("RANK", "0")], &NO_FLAGS);
    assert_eq!(e, "RANK is set but WORLD_SIZE is not; a torchrun launch sets RANK and WORLD_SIZE in every process");
    let e = refused(&[("SLURM_NTASKS", "2")], &NO_FLAGS);
    assert_eq!(e, "SLURM_NTASKS is set but SLURM_PROCID is not; a slurm launch sets SLURM_PROCID and SLURM_NTASKS in every process");
    let e = refused(&[("RANK", "0"), ("WORLD_SIZE", "2")], &NO_FLAGS);
    assert!(
        e.starts_with("RANK and WORLD_SIZE are set but MASTER_ADDR is not"),
        "{e}"
    );
    let e = refused(
        &[("RANK", "0"), ("WORLD_SIZE", "2"), ("MASTER_ADDR", "h")],
        &NO_FLAGS,
    );
    assert!(
        e.starts_with("MASTER_ADDR is set but MASTER_PORT is not"),
        "{e}"
    );
    let e = refused(
        &[("OMPI_COMM_WORLD_RANK", "0"), ("OMPI_COMM_WORLD_SIZE", "2")],
        &NO_FLAGS,
    );
    assert!(
        e.starts_with("open mpi sets no rendezvous address; set MASTER_ADDR"),
        "{e}"
    );
    let e = refused(&[("PMIX_RANK", "1")], &NO_FLAGS);
    assert!(
        e.starts_with("PMIX_RANK=1 is set, but no variable gives the world size"),
        "{e}"
    );
    let e = refused(&[("SLURM_PROCID", "0"), ("SLURM_NTASKS", "2")], &NO_FLAGS);
    assert!(
        e.starts_with("slurm sets neither SLURM_STEP_NODELIST nor SLURM_JOB_NODELIST"),
        "{e}"
    );
    let e = refused(
        &[],
        &Flags {
            port: Some(1),
            ..NO_FLAGS
        },
    );
    assert!(
        e.starts_with(
            "--port sets the port of a launcher's rendezvous, but no launcher is detected"
        ),
        "{e}"
    );
    let e = refused(
        &[],
        &Flags {
            process: Some(0),
            processes: Some(2),
            ..NO_FLAGS
        },
    );
    assert!(
        e.starts_with("--process and --processes need --rendezvous HOST:PORT"),
        "{e}"
    );
}

#[test]
fn bad_and_conflicting_values_are_refused_by_name() {
    let slurm = |rank: &'static str, size: &'static str| {
        refused(
            &[
                ("SLURM_PROCID", rank),
                ("SLURM_NTASKS", size),
                ("SLURM_JOB_NODELIST", "n1"),
            ],
            &NO_FLAGS,
        )
    };
    assert_eq!(
        slurm("x", "2"),
        "SLURM_PROCID=`x` is not allowed; allowed: an integer 0 or more"
    );
    assert_eq!(
        slurm("2", "2"),
        "SLURM_PROCID=2 is not below SLURM_NTASKS=2; allowed: 0..2"
    );
    assert_eq!(slurm("0", "0"), "SLURM_NTASKS=0; allowed: 1 or more");
    // every problem at once
    assert_eq!(
        slurm("-1", "two"),
        "SLURM_PROCID=`-1` is not allowed; allowed: an integer 0 or more\nSLURM_NTASKS=`two` is not allowed; allowed: an integer 0 or more"
    );
    let e = refused(
        &[
            ("OMPI_COMM_WORLD_RANK", "1"),
            ("OMPI_COMM_WORLD_SIZE", "4"),
            ("PMIX_RANK", "2"),
            ("MASTER_ADDR", "h"),
        ],
        &NO_FLAGS,
    );
    assert_eq!(e, "OMPI_COMM_WORLD_RANK=1 but PMIX_RANK=2: two launchers give this process different ranks; start it under one launcher");
    let e = refused(
        &[
            ("RANK", "0"),
            ("WORLD_SIZE", "2"),
            ("LOCAL_RANK", "2"),
            ("MASTER_ADDR", "h"),
            ("MASTER_PORT", "1"),
        ],
        &NO_FLAGS,
    );
    assert_eq!(e, "LOCAL_RANK=2 is not below WORLD_SIZE=2; allowed: 0..2");
    let torch = [("RANK", "0"), ("WORLD_SIZE", "2"), ("MASTER_ADDR", "h")];
    let e = refused(
        &[&torch[..], &[("MASTER_PORT", "70000")]].concat(),
        &NO_FLAGS,
    );
    assert_eq!(
        e,
        "MASTER_PORT=`70000` is not allowed; allowed: a port 1..=65535"
    );
    let agent = [
        &torch[..],
        &[
            ("MASTER_PORT", "29500"),
            ("TORCHELASTIC_USE_AGENT_STORE", "True"),
        ],
    ]
    .concat();
    let e = refused(&agent, &NO_FLAGS);
    assert!(
        e.starts_with("MASTER_PORT=29500 is torchrun's own store"),
        "{e}"
    );
    let with_port = Flags {
        port: Some(29501),
        ..NO_FLAGS
    };
    assert_eq!(assigned(&agent, &with_port).rendezvous, "h:29501");
    let e = refused(
        &[
            ("SLURM_PROCID", "1"),
            ("SLURM_NTASKS", "2"),
            ("SLURM_JOB_NODELIST", "n1"),
        ],
        &Flags {
            processes: Some(1),
            ..NO_FLAGS
        },
    );
    assert_eq!(e, "process 1 (SLURM_PROCID=1) is not below the world size 1 (--processes 1 over SLURM_NTASKS=2); processes are numbered 0..1");
    let e = refused(
        &[
            ("SLURM_PROCID", "0"),
            ("SLURM_NTASKS", "2"),
            ("SLURM_JOB_NODELIST", "n[2-1]"),
        ],
        &NO_FLAGS,
    );
    assert_eq!(e, "SLURM_JOB_NODELIST=`n[2-1]`: `[2-1]` holds the range 2-1, which runs backwards; allowed: N-M with N <= M");
}

#[test]
fn non_utf8_values_are_refused_by_name() {
    use std::os::unix::ffi::OsStringExt;
    let bad = OsString::from_vec(vec![b'n', 0xff]);
    let e = Env::from_os([("MASTER_ADDR", Some(bad))]).unwrap_err();
    assert_eq!(
        format!("{e}"),
        "MASTER_ADDR=\"n\\xFF\" is not UTF-8; allowed: an integer or a host name"
    );
}

#[test]
fn slurm_node_lists_start_with_their_first_host() {
    for (list, first) in [
        ("node03", "node03"),
        ("node[03-05,07]", "node03"),
        ("node[07,03-05]", "node07"),
        ("gpu1,gpu2", "gpu1"),
        ("a[1-2],b[3-4]", "a1"),
        ("node[001-128]-ib", "node001-ib"),
        ("rack[1-2]-n[01-04]", "rack1-n01"),
        ("n[5]", "n5"),
        (" host.example.org ", "host.example.org"),
    ] {
        assert_eq!(first_host(list).unwrap(), first, "{list}");
    }
    for (list, error) in [
        ("", "no host; allowed: host[N-M,K],..."),
        ("node[1-2", "`[` without `]`; allowed: host[N-M,K],..."),
        ("node1-2]", "`]` without `[`; allowed: host[N-M,K],..."),
        (
            "node[[1]]",
            "a bracket inside a bracket; allowed: host[N-M,K],...",
        ),
        (
            "node[a-b]",
            "`[a-b]` holds `a-b`; allowed: numbers and ranges N-M, comma-separated",
        ),
        (
            "node[1,]",
            "`[1,]` holds ``; allowed: numbers and ranges N-M, comma-separated",
        ),
        (
            "node[10-9]",
            "`[10-9]` holds the range 10-9, which runs backwards; allowed: N-M with N <= M",
        ),
        ("node 1", "a space in a host name; allowed: host[N-M,K],..."),
    ] {
        let e = first_host(list).expect_err(list);
        assert_eq!(format!("{e}"), error, "{list}");
    }
}
