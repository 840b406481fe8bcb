//! A Hugging Face Hub in a test: a local HTTP server answering the Hub's URL layout (the
//! revision API, `resolve/` with its etag and commit headers, LFS files redirected to a storage
//! path, Range requests), with faults on request: a connection cut mid-body, a corrupted body,
//! a gated repository. Every request is logged for the test to check.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::{Arc, Mutex};

use sha1::Digest as _;

/// One file of a commit; `lfs` files are served the way the Hub serves LFS (sha256 etag,
/// redirect to storage).
#[derive(Clone)]
pub struct FakeFile {
    pub name: String,
    pub bytes: Vec<u8>,
    pub lfs: bool,
}

impl FakeFile {
    pub fn new(name: &str, bytes: Vec<u8>, lfs: bool) -> FakeFile {
        FakeFile {
            name: name.to_string(),
            bytes,
            lfs,
        }
    }

    /// The file's sha256 (its etag when it is an LFS file).
    pub fn sha256(&self) -> String {
        hex(&sha2::Sha256::digest(&self.bytes))
    }

    /// The file's git blob id (its etag otherwise).
    pub fn git_sha1(&self) -> String {
        let mut h = sha1::Sha1::new();
        h.update(format!("blob {}\0", self.bytes.len()));
        h.update(&self.bytes);
        hex(&h.finalize())
    }

    pub fn etag(&self) -> String {
        if self.lfs {
            self.sha256()
        } else {
            self.git_sha1()
        }
    }
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// A request the server saw.
#[derive(Clone, Debug)]
pub struct Logged {
    pub method: String,
    pub path: String,
    pub range: Option<String>,
    pub authorization: Option<String>,
}

#[derive(Default)]
struct Repo {
    /// revision name → commit
    refs: HashMap<String, String>,
    commits: HashMap<String, Vec<FakeFile>>,
    token: Option<String>,
}

#[derive(Default)]
struct State {
    repos: HashMap<String, Repo>,
    /// file name → (bytes to send before cutting the connection, cuts left)
    cuts: HashMap<String, (usize, usize)>,
    /// file names served with one byte flipped
    corrupt: Vec<String>,
    log: Vec<Logged>,
    /// Where LFS files are redirected to.
    storage: String,
    /// List files without hashes (as the API does without `?blobs=true`).
    bare_listing: bool,
    /// Answer every Range request with the whole file (200), as a server without ranges does.
    ignore_ranges: bool,
}

/// The server; it runs until the test process ends.
pub struct FakeHub {
    url: String,
    state: Arc<Mutex<State>>,
}

fn listen(state: &Arc<Mutex<State>>) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind a local port");
    let url = format!("http://{}", listener.local_addr().unwrap());
    let s = state.clone();
    std::thread::spawn(move || {
        for conn in listener.incoming().flatten() {
            let s = s.clone();
            std::thread::spawn(move || {
                let _ = serve(conn, &s);
            });
        }
    });
    url
}

impl FakeHub {
    /// Starts the Hub and its LFS storage (another port: another origin, as the Hub's CDN is).
    pub fn start() -> FakeHub {
        let state = Arc::new(Mutex::new(State::default()));
        let url = listen(&state);
        let storage = listen(&state);
        state.lock().unwrap().storage = storage;
        FakeHub { url, state }
    }

    /// The endpoint, for HF_ENDPOINT.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// Adds `commit` (40 hex digits) with `files` to `repo`, named by each of `revisions`.
    pub fn add_commit(&self, repo: &str, commit: &str, revisions: &[&str], files: Vec<FakeFile>) {
        let mut st = self.state.lock().unwrap();
        let r = st.repos.entry(repo.to_string()).or_default();
        r.commits.insert(commit.to_string(), files);
        for rev in revisions {
            r.refs.insert(rev.to_string(), commit.to_string());
        }
    }

    /// Makes `repo` answer 401 (gated) unless the request carries `Bearer <token>`.
    pub fn gate(&self, repo: &str, token: &str) {
        self.state
            .lock()
            .unwrap()
            .repos
            .get_mut(repo)
            .expect("a repo")
            .token = Some(token.to_string());
    }

    /// The next `times` bodies of `file` are cut after `after` bytes.
    pub fn cut(&self, file: &str, after: usize, times: usize) {
        self.state
            .lock()
            .unwrap()
            .cuts
            .insert(file.to_string(), (after, times));
    }

    /// `file` is served with one byte changed (and its etag unchanged).
    pub fn corrupt(&self, file: &str) {
        self.state.lock().unwrap().corrupt.push(file.to_string());
    }

    /// The revision API lists names and sizes only: hashes come from the file's headers.
    pub fn bare_listing(&self) {
        self.state.lock().unwrap().bare_listing = true;
    }

    /// Range requests are answered with the whole file.
    pub fn ignore_ranges(&self) {
        self.state.lock().unwrap().ignore_ranges = true;
    }

    pub fn heal(&self, file: &str) {
        self.state.lock().unwrap().corrupt.retain(|f| f != file);
    }

    pub fn log(&self) -> Vec<Logged> {
        self.state.lock().unwrap().log.clone()
    }
}

fn decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' && i + 2 < b.len() {
            if let Ok(v) = u8::from_str_radix(&s[i + 1..i + 3], 16) {
                out.push(v);
                i += 3;
                continue;
            }
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

struct Answer {
    status: u16,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
    /// The file whose faults apply to the body.
    file: Option<String>,
}

fn answer(status: u16, headers: &[(&str, String)], body: Vec<u8>) -> Answer {
    Answer {
        status,
        headers: headers
            .iter()
            .map(|(k, v)| (k.to_string(), v.clone()))
            .collect(),
        body,
        file: None,
    }
}

fn error(status: u16, code: &str, msg: &str) -> Answer {
    let body = serde_json::json!({ "error": msg }).to_string().into_bytes();
    answer(
        status,
        &[
            ("X-Error-Code", code.to_string()),
            ("X-Error-Message", msg.to_string()),
            ("Content-Type", "application/json".into()),
        ],
        body,
    )
}

/// The body from `range` (`bytes=N-`), as 206 (or 416 past the end), else whole as 200.
fn ranged(
    bytes: &[u8],
    range: Option<&str>,
    mut headers: Vec<(&str, String)>,
    file: &str,
) -> Answer {
    let len = bytes.len();
    let start = range
        .and_then(|r| r.strip_prefix("bytes="))
        .and_then(|r| r.split('-').next())
        .and_then(|n| n.parse::<usize>().ok());
    let mut a = match start {
        Some(s) if s >= len => {
            headers.push(("Content-Range", format!("bytes */{len}")));
            answer(416, &headers, Vec::new())
        }
        Some(s) => {
            headers.push(("Content-Range", format!("bytes {s}-{}/{len}", len - 1)));
            answer(206, &headers, bytes[s..].to_vec())
        }
        None => answer(200, &headers, bytes.to_vec()),
    };
    a.file = Some(file.to_string());
    a
}

fn route(st: &State, method: &str, path: &str, range: Option<&str>, auth: Option<&str>) -> Answer {
    let parts: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    // /lfs-storage/<sha256>: an LFS file's bytes, as the Hub's storage serves them.
    if let ["lfs-storage", sha] = parts.as_slice() {
        for repo in st.repos.values() {
            for files in repo.commits.values() {
                if let Some(f) = files.iter().find(|f| f.lfs && f.sha256() == *sha) {
                    return ranged(
                        &f.bytes,
                        range,
                        vec![("ETag", format!("\"{sha}\""))],
                        &f.name,
                    );
                }
            }
        }
        return error(404, "EntryNotFound", "no such object");
    }
    let (repo_id, rest) = match parts.as_slice() {
        ["api", "models", org, name, rest @ ..] => (format!("{org}/{name}"), rest),
        [org, name, rest @ ..] => (format!("{org}/{name}"), rest),
        _ => return error(404, "RepoNotFound", "not found"),
    };
    let Some(repo) = st.repos.get(&repo_id) else {
        return error(
            404,
            "RepoNotFound",
            &format!("Repository Not Found for url: {path}."),
        );
    };
    if let Some(t) = &repo.token {
        if auth != Some(&format!("Bearer {t}")) {
            return error(401, "GatedRepo", &format!("Access to model {repo_id} is restricted. You must have access to it and be authenticated to access it. Please log in."));
        }
    }
    let commit_of = |rev: &str| -> Option<String> {
        let rev = decode(rev);
        if repo.commits.contains_key(&rev) {
            Some(rev)
        } else {
            repo.refs.get(&rev).cloned()
        }
    };
    match (parts[0], rest) {
        ("api", ["revision", rev]) => {
            let Some(commit) = commit_of(rev) else {
                return error(
                    404,
                    "RevisionNotFound",
                    &format!("Invalid rev id: {}", decode(rev)),
                );
            };
            let siblings: Vec<_> = repo.commits[&commit]
                .iter()
                .map(|f| {
                    let mut s = serde_json::json!({ "rfilename": f.name, "size": f.bytes.len(), "blobId": f.git_sha1() });
                    if st.bare_listing {
                        s = serde_json::json!({ "rfilename": f.name });
                    } else if f.lfs {
                        s["lfs"] = serde_json::json!({ "sha256": f.sha256(), "size": f.bytes.len(), "pointerSize": 134 });
                    }
                    s
                })
                .collect();
            let body = serde_json::json!({ "id": repo_id, "sha": commit, "siblings": siblings });
            answer(
                200,
                &[("Content-Type", "application/json".into())],
                body.to_string().into_bytes(),
            )
        }
        (_, ["resolve", rev, file @ ..]) if !file.is_empty() => {
            let Some(commit) = commit_of(rev) else {
                return error(404, "RevisionNotFound", "Invalid rev id");
            };
            let name = decode(&file.join("/"));
            let Some(f) = repo.commits[&commit].iter().find(|f| f.name == name) else {
                return error(
                    404,
                    "EntryNotFound",
                    &format!("{name} does not exist on \"{}\"", decode(rev)),
                );
            };
            let mut headers = vec![("X-Repo-Commit", commit.clone())];
            if f.lfs {
                headers.push(("X-Linked-Etag", format!("\"{}\"", f.sha256())));
                headers.push(("X-Linked-Size", f.bytes.len().to_string()));
                headers.push(("ETag", format!("\"{}\"", f.git_sha1())));
                headers.push((
                    "Location",
                    format!("{}/lfs-storage/{}", st.storage, f.sha256()),
                ));
                return answer(302, &headers, Vec::new());
            }
            headers.push(("ETag", format!("\"{}\"", f.git_sha1())));
            let _ = method;
            ranged(&f.bytes, range, headers, &f.name)
        }
        _ => error(404, "EntryNotFound", "no such route"),
    }
}

fn serve(conn: TcpStream, state: &Mutex<State>) -> std::io::Result<()> {
    let mut reader = BufReader::new(conn.try_clone()?);
    let mut line = String::new();
    reader.read_line(&mut line)?;
    let mut it = line.split_whitespace();
    let (method, target) = (
        it.next().unwrap_or("").to_string(),
        it.next().unwrap_or("").to_string(),
    );
    let (mut range, mut auth) = (None, None);
    loop {
        let mut h = String::new();
        if reader.read_line(&mut h)? == 0 || h.trim().is_empty() {
            break;
        }
        if let Some((k, v)) = h.split_once(':') {
            match k.trim().to_ascii_lowercase().as_str() {
                "range" => range = Some(v.trim().to_string()),
                "authorization" => auth = Some(v.trim().to_string()),
                _ => {}
            }
        }
    }
    let path = target.split('?').next().unwrap_or("").to_string();
    let (a, cut, corrupt) = {
        let mut st = state.lock().unwrap();
        st.log.push(Logged {
            method: method.clone(),
            path: path.clone(),
            range: range.clone(),
            authorization: auth.clone(),
        });
        let served_range = range.as_deref().filter(|_| !st.ignore_ranges);
        let a = route(&st, &method, &path, served_range, auth.as_deref());
        let mut cut = None;
        let mut corrupt = false;
        if let (Some(f), true) = (&a.file, method == "GET") {
            if let Some((after, left)) = st.cuts.get_mut(f) {
                if *left > 0 {
                    *left -= 1;
                    cut = Some(*after);
                }
            }
            corrupt = st.corrupt.contains(f);
        }
        (a, cut, corrupt)
    };
    let mut body = a.body;
    if corrupt && !body.is_empty() {
        let mid = body.len() / 2;
        body[mid] ^= 0x5a;
    }
    let mut w = conn;
    let mut head = format!(
        "HTTP/1.1 {} X\r\nContent-Length: {}\r\nConnection: close\r\n",
        a.status,
        body.len()
    );
    for (k, v) in &a.headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    head.push_str("\r\n");
    w.write_all(head.as_bytes())?;
    if method != "HEAD" {
        match cut {
            Some(n) => {
                w.write_all(&body[..n.min(body.len())])?;
                w.flush()?;
                w.shutdown(std::net::Shutdown::Both)?;
                return Ok(());
            }
            None => w.write_all(&body)?,
        }
    }
    w.flush()
}
