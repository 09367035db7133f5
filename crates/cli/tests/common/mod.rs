//! A real `tokenmill serve` process for end-to-end tests: started on a free port (`--port 0`,
//! the bound address read from its log), killed when dropped.

#![allow(dead_code, clippy::expect_used, clippy::unwrap_used, clippy::panic)]

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

pub use tokenmill_test_assets::default_model as model_path;

pub fn binary() -> &'static str {
    env!("CARGO_BIN_EXE_tokenmill")
}

pub struct Server {
    child: Child,
    pub base_url: String,
    /// Every line the server wrote to stderr so far (its log).
    log: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
}

impl Server {
    /// Starts `tokenmill serve` on the default model with `extra` flags.
    pub fn start(extra: &[&str]) -> Server {
        let mut child = Command::new(binary())
            .arg("serve")
            .arg(model_path())
            .args(["--port", "0", "--served-model-name", "tm-test"])
            .args(extra)
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("tokenmill serve starts");
        let stderr = child.stderr.take().expect("piped stderr");
        let (tx, rx) = mpsc::channel();
        let log = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let sink = std::sync::Arc::clone(&log);
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if let Some(at) = line.find("Listening on ") {
                    let _ = tx.send(line[at + "Listening on ".len()..].trim().to_string());
                }
                sink.lock().unwrap().push(line);
            }
        });
        let base_url = match rx.recv_timeout(Duration::from_secs(60)) {
            Ok(url) => url,
            Err(e) => {
                let status = child.try_wait();
                // The reader thread may still be appending the last lines of an exited server.
                std::thread::sleep(Duration::from_millis(200));
                let lines = log.lock().map(|l| l.join("\n")).unwrap_or_default();
                panic!(
                    "server did not announce its address ({e}; exit {status:?}); its log:\n{lines}"
                );
            }
        };
        Server {
            child,
            base_url,
            log,
        }
    }

    /// The server's log lines so far.
    pub fn log_lines(&self) -> Vec<String> {
        self.log.lock().unwrap().clone()
    }

    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// GET `path` and return the body (blocking, via curl-free std TCP).
    pub fn get(&self, path: &str) -> String {
        http_get(&self.base_url, path)
    }

    /// The value of one metric sample whose line starts with `prefix` (name plus labels).
    pub fn metric(&self, name: &str) -> f64 {
        metric_value(&self.get("/metrics"), name)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Sum of all samples of `name` (any labels) in a Prometheus text body.
pub fn metric_value(body: &str, name: &str) -> f64 {
    body.lines()
        .filter(|l| !l.starts_with('#'))
        .filter(|l| l.starts_with(&format!("{name}{{")) || l.starts_with(&format!("{name} ")))
        .filter_map(|l| l.rsplit_once(' ').and_then(|(_, v)| v.parse::<f64>().ok()))
        .sum()
}

fn http_get(base_url: &str, path: &str) -> String {
    use std::io::{Read, Write};
    let host = base_url.trim_start_matches("http://");
    let mut stream = std::net::TcpStream::connect(host).expect("connect");
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n"
    )
    .expect("write");
    let mut response = String::new();
    stream.read_to_string(&mut response).expect("read");
    let (head, body) = response.split_once("\r\n\r\n").unwrap_or((&response, ""));
    if head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        dechunk(body)
    } else {
        body.to_string()
    }
}

fn dechunk(body: &str) -> String {
    let mut out = String::new();
    let mut rest = body;
    while let Some((size_line, after)) = rest.split_once("\r\n") {
        let size = usize::from_str_radix(size_line.trim(), 16).unwrap_or(0);
        if size == 0 {
            break;
        }
        out.push_str(&after[..size.min(after.len())]);
        rest = after.get(size + 2..).unwrap_or("");
    }
    out
}

/// Runs `tokenmill <args>` to completion, returning (success, stdout, stderr).
pub fn run_cli(args: &[&str]) -> (bool, String, String) {
    let output = Command::new(binary())
        .args(args)
        .output()
        .expect("tokenmill runs");
    (
        output.status.success(),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

/// The number after `label` in vLLM's printed result block.
pub fn block_value(block: &str, label: &str) -> f64 {
    block
        .lines()
        .find(|l| l.starts_with(label))
        .and_then(|l| l[label.len()..].trim().parse().ok())
        .unwrap_or_else(|| panic!("no '{label}' line in:\n{block}"))
}
