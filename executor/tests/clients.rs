//! `memra-run serve` driven by real clients: starts the built server on the CPU backend with
//! SmolLM2 and runs `scripts/client-tests.sh` against it, which installs the `openai` Python
//! package into a git-ignored virtualenv and checks completions, chat, streaming, concurrent
//! requests, a closed stream and the bad requests with it and with curl
//! (`scripts/client_tests.py`). Fails, with the script's output and the server's log, when the
//! script fails, python3 or its venv module or curl included: CI must have them.

mod common;

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};

use common::{root, smollm2};

/// The server, killed when dropped.
struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn the_openai_package_and_curl_get_their_answers() {
    smollm2("smollm2");
    // Two kernel threads: cargo runs test binaries one at a time, and this one has one test.
    let mut child = Command::new(env!("CARGO_BIN_EXE_memra-run"))
        .current_dir(root())
        .args(["serve", "plans/smollm2.plan.toml", "--port", "0", "-t", "2"])
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let server = Server(child);
    let port: u16 = loop {
        let line = lines
            .next()
            .expect("the server exited before listening")
            .unwrap();
        if let Some(at) = line.split("http://127.0.0.1:").nth(1) {
            let digits: String = at.chars().take_while(char::is_ascii_digit).collect();
            break digits.parse().unwrap();
        }
    };
    let log = Arc::new(Mutex::new(Vec::new()));
    let sink = log.clone();
    std::thread::spawn(move || {
        for line in lines.map_while(Result::ok) {
            sink.lock().unwrap().push(line);
        }
    });

    let out = Command::new("bash")
        .current_dir(root())
        .arg("scripts/client-tests.sh")
        .arg(format!("http://127.0.0.1:{port}"))
        .output()
        .expect("running bash scripts/client-tests.sh");
    drop(server);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "scripts/client-tests.sh failed ({}):\n{stdout}\n{stderr}\nserver log:\n{}",
        out.status,
        log.lock().unwrap().join("\n")
    );
    println!("{stdout}{stderr}");
}
