//! The rendezvous: how `--processes` processes find each other and end up with one TCP
//! connection per pair (a full mesh).
//!
//! Process 0 listens at the rendezvous address and prints the address it bound (so a port of
//! 0 works: `launch` reads the line). Every other process binds a listener of its own on the
//! interface that reaches process 0, connects to process 0 and says `Hello` with its index
//! and that listener's address. Once all have joined, process 0 answers each with the table
//! of addresses; process `p` then connects to every process `1..p` and accepts one connection
//! from every process after it. The connections to process 0 are the rendezvous connections
//! themselves. Everything is refused by name: a second process with one index, a different
//! `--processes`, another build's protocol, a process that does not come within the timeout.

use std::io::ErrorKind;
use std::net::{SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};

use super::frame::{self, hello, Msg, VERSION};

/// How long processes wait for each other while joining.
pub const JOIN_TIMEOUT: Duration = Duration::from_secs(60);
/// How process 0 announces the address it listens at, on stderr; `launch` reads it.
pub const LISTENING: &str = "rendezvous: process 0 listens at ";

/// Joins the world of `processes` as process `process`; returns a connection to every other
/// process, indexed by process (`None` at this process).
pub fn join(process: u32, processes: u32, rendezvous: &str) -> Result<Vec<Option<TcpStream>>> {
    if processes == 0 || process >= processes {
        bail!("--process {process} is not below --processes {processes}; processes are numbered 0..{processes}");
    }
    let deadline = Instant::now() + JOIN_TIMEOUT;
    let mut peers: Vec<Option<TcpStream>> = (0..processes).map(|_| None).collect();
    if process == 0 {
        let listener = TcpListener::bind(rendezvous)
            .with_context(|| format!("cannot listen at the rendezvous address {rendezvous}"))?;
        eprintln!("{LISTENING}{}", listener.local_addr()?);
        let mut table = vec![String::new(); processes as usize];
        for _ in 1..processes {
            let (stream, from, listen) = accept(&listener, 0, processes, deadline, &peers)?;
            table[from as usize] = listen;
            peers[from as usize] = Some(stream);
        }
        for stream in peers.iter_mut().flatten() {
            frame::write(
                stream,
                &Msg::Table {
                    listen: table.clone(),
                },
            )?;
        }
    } else {
        let mut to_zero = connect(rendezvous, deadline)
            .with_context(|| format!("cannot reach process 0 at the rendezvous {rendezvous}"))?;
        let here = to_zero.local_addr()?.ip();
        let listener = TcpListener::bind((here, 0))
            .with_context(|| format!("cannot listen for peers on {here}"))?;
        let listen = listener.local_addr()?.to_string();
        frame::write(&mut to_zero, &hello(process, processes, listen))?;
        let table = match receive(&mut to_zero, deadline, "process 0")? {
            Msg::Table { listen } if listen.len() == processes as usize => listen,
            _ => bail!("process 0 answered the rendezvous with something other than the table of processes"),
        };
        peers[0] = Some(to_zero);
        for q in 1..process {
            let addr = &table[q as usize];
            let mut s = connect(addr, deadline)
                .with_context(|| format!("cannot reach process {q} at {addr}"))?;
            frame::write(&mut s, &hello(process, processes, String::new()))?;
            peers[q as usize] = Some(s);
        }
        for _ in process + 1..processes {
            let (stream, from, _) = accept(&listener, process, processes, deadline, &peers)?;
            if from <= process {
                bail!("process {from} connected to process {process}; only later processes do");
            }
            peers[from as usize] = Some(stream);
        }
    }
    Ok(peers)
}

/// Accepts one process into process `me`: its stream, index and listening address.
fn accept(
    listener: &TcpListener,
    me: u32,
    processes: u32,
    deadline: Instant,
    peers: &[Option<TcpStream>],
) -> Result<(TcpStream, u32, String)> {
    listener.set_nonblocking(true)?;
    let stream = loop {
        match listener.accept() {
            Ok((s, _)) => break s,
            Err(e) if e.kind() == ErrorKind::WouldBlock => {
                if Instant::now() >= deadline {
                    let missing: Vec<String> = (0..processes)
                        .filter(|&p| p != me && peers[p as usize].is_none())
                        .map(|p| p.to_string())
                        .collect();
                    bail!(
                        "process(es) {} did not join within {} s; start every process with the same --processes and --rendezvous",
                        missing.join(", "),
                        JOIN_TIMEOUT.as_secs()
                    );
                }
                std::thread::sleep(Duration::from_millis(5));
            }
            Err(e) => return Err(e).context("accepting a process"),
        }
    };
    stream.set_nonblocking(false)?;
    let mut stream = stream;
    match receive(&mut stream, deadline, "a joining process")? {
        Msg::Hello {
            version,
            process,
            processes: theirs,
            listen,
        } => {
            if version != VERSION {
                bail!("a process speaking protocol version {version} joined; this build speaks {VERSION}: run the same memra-run build everywhere");
            }
            if theirs != processes {
                bail!("process {process} was started with --processes {theirs}, this one with {processes}; every process needs the same --processes");
            }
            if process >= processes {
                bail!("a process joined as process {process}, but --processes is {processes}; processes are numbered 0..{processes}");
            }
            if peers[process as usize].is_some() {
                bail!("two processes joined as process {process}; give each process its own --process");
            }
            Ok((stream, process, listen))
        }
        _ => bail!("a joining process did not introduce itself"),
    }
}

/// Connects to `addr`, retrying until `deadline` (the peer may not listen yet).
fn connect(addr: &str, deadline: Instant) -> Result<TcpStream> {
    loop {
        let resolved: Vec<SocketAddr> = addr
            .to_socket_addrs()
            .with_context(|| format!("`{addr}` is not an address; give HOST:PORT"))?
            .collect();
        let mut last = anyhow!("`{addr}` resolves to no address");
        for a in &resolved {
            match TcpStream::connect_timeout(a, Duration::from_secs(1)) {
                Ok(s) => {
                    s.set_nodelay(true)?;
                    return Ok(s);
                }
                Err(e) => last = e.into(),
            }
        }
        if Instant::now() >= deadline {
            return Err(last.context(format!("gave up after {} s", JOIN_TIMEOUT.as_secs())));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Reads one handshake message from `who` before `deadline`.
fn receive(stream: &mut TcpStream, deadline: Instant, who: &str) -> Result<Msg> {
    let left = deadline
        .saturating_duration_since(Instant::now())
        .max(Duration::from_millis(1));
    stream.set_read_timeout(Some(left))?;
    stream.set_nodelay(true)?;
    let msg = frame::read(stream)
        .with_context(|| format!("joining: reading from {who}"))?
        .ok_or_else(|| anyhow!("joining: {who} closed the connection"))?;
    stream.set_read_timeout(None)?;
    Ok(msg)
}
