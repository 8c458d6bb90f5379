//! A test HTTP server on loopback: each request recorded, answered by a handler (a status and
//! a body, or never until the server is dropped).

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};

use serde_json::{json, Value};

#[derive(Debug, Clone)]
pub struct Request {
    pub method: String,
    pub path: String,
    pub body: String,
    /// The `Authorization` header, if sent.
    pub authorization: Option<String>,
    /// The `Content-Type` header, if sent.
    pub content_type: Option<String>,
}

/// What a test server answers: status and body, or hang until the server is dropped.
pub enum Reply {
    Json(u16, Value),
    Text(u16, &'static str),
    Hang,
}

pub type Handler = dyn Fn(&Request, usize) -> Reply + Send + Sync;

pub struct Server {
    pub url: String,
    requests: Arc<Mutex<Vec<Request>>>,
    released: Arc<(Mutex<bool>, Condvar)>,
    stop: Arc<AtomicBool>,
    port: u16,
}

impl Server {
    pub fn new(handler: impl Fn(&Request, usize) -> Reply + Send + Sync + 'static) -> Server {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let requests = Arc::new(Mutex::new(Vec::new()));
        let released = Arc::new((Mutex::new(false), Condvar::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let handler: Arc<Handler> = Arc::new(handler);
        let count = Arc::new(AtomicUsize::new(0));
        {
            let (requests, released, stop) = (requests.clone(), released.clone(), stop.clone());
            std::thread::spawn(move || {
                for conn in listener.incoming() {
                    if stop.load(Ordering::SeqCst) {
                        break;
                    }
                    let Ok(conn) = conn else { continue };
                    let (requests, released, handler, count) = (
                        requests.clone(),
                        released.clone(),
                        handler.clone(),
                        count.clone(),
                    );
                    std::thread::spawn(move || {
                        serve_one(conn, &requests, &released, &*handler, &count)
                    });
                }
            });
        }
        Server {
            url: format!("http://127.0.0.1:{port}"),
            requests,
            released,
            stop,
            port,
        }
    }

    pub fn ok() -> Server {
        Server::new(|_, _| Reply::Json(200, json!({"status": "ok"})))
    }

    pub fn requests(&self) -> Vec<Request> {
        self.requests.lock().unwrap().clone()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let (lock, cv) = &*self.released;
        *lock.lock().unwrap() = true;
        cv.notify_all();
        self.stop.store(true, Ordering::SeqCst);
        let _ = TcpStream::connect(("127.0.0.1", self.port)); // wake the accept loop
    }
}

fn serve_one(
    conn: TcpStream,
    requests: &Mutex<Vec<Request>>,
    released: &(Mutex<bool>, Condvar),
    handler: &Handler,
    count: &AtomicUsize,
) {
    let mut reader = BufReader::new(conn.try_clone().unwrap());
    let mut line = String::new();
    if reader.read_line(&mut line).unwrap_or(0) == 0 {
        return;
    }
    let mut parts = line.split_whitespace();
    let (method, path) = (
        parts.next().unwrap_or("").to_string(),
        parts.next().unwrap_or("").to_string(),
    );
    let mut length = 0;
    let mut authorization = None;
    let mut content_type = None;
    loop {
        let mut h = String::new();
        if reader.read_line(&mut h).unwrap_or(0) == 0 || h == "\r\n" {
            break;
        }
        if let Some((k, v)) = h.split_once(':') {
            if k.eq_ignore_ascii_case("content-length") {
                length = v.trim().parse().unwrap_or(0);
            } else if k.eq_ignore_ascii_case("authorization") {
                authorization = Some(v.trim().to_string());
            } else if k.eq_ignore_ascii_case("content-type") {
                content_type = Some(v.trim().to_string());
            }
        }
    }
    let mut body = vec![0; length];
    let _ = reader.read_exact(&mut body);
    let req = Request {
        method,
        path,
        body: String::from_utf8_lossy(&body).into_owned(),
        authorization,
        content_type,
    };
    requests.lock().unwrap().push(req.clone());
    let n = count.fetch_add(1, Ordering::SeqCst);
    let (status, text) = match handler(&req, n) {
        Reply::Json(s, v) => (s, v.to_string()),
        Reply::Text(s, t) => (s, t.to_string()),
        Reply::Hang => {
            let (lock, cv) = released;
            let mut done = lock.lock().unwrap();
            while !*done {
                done = cv.wait(done).unwrap();
            }
            return;
        }
    };
    let mut conn = conn;
    let _ = write!(
        conn,
        "HTTP/1.1 {status} X\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{text}",
        text.len()
    );
}
