//! A loopback stand-in for an OpenAI-compatible chat-completions service, so tests can drive
//! the `openai` AI provider through answers, refusals, garbage, hangs and error statuses
//! without a network or a key. It records every request it receives.

#![allow(dead_code, reason = "each test module uses only some of the fake's modes and accessors")]

use std::sync::{Arc, Mutex};
use std::time::Duration;

use actix_web::http::StatusCode;
use actix_web::{App, HttpRequest, HttpResponse, HttpServer, web};
use serde_json::{Value, json};

/// How the fake answers `POST /v1/chat/completions`; change it with [`FakeAi::set_mode`].
#[derive(Debug, Clone)]
pub(crate) enum Mode {
    /// A completion whose content is `{"value": <value>}`.
    Answer(Value),
    /// A completion with `message.refusal` set and no content.
    Refuse,
    /// A completion whose content is `not json`.
    Garbage,
    /// Waits this long, then answers like the default `Answer("filled")`.
    Hang(Duration),
    /// This HTTP status with an OpenAI-style error body.
    Status(u16),
    /// HTTP 200 with exactly this body, for shapes the other modes do not cover.
    Body(Value),
}

impl Default for Mode {
    fn default() -> Self {
        Mode::Answer(json!("filled"))
    }
}

/// A running fake; it stops when dropped.
pub(crate) struct FakeAi {
    /// The base endpoint to configure as `APP__AI__ENDPOINT`, e.g. `http://127.0.0.1:PORT/v1`.
    pub url: String,
    pub port: u16,
    state: Arc<State>,
    server: actix_web::dev::ServerHandle,
}

#[derive(Default)]
struct State {
    mode: Mutex<Mode>,
    requests: Mutex<Vec<RecordedRequest>>,
}

#[derive(Debug, Clone)]
struct RecordedRequest {
    authorization: Option<String>,
    body: Value,
}

impl FakeAi {
    /// Starts the fake on 127.0.0.1 on a free port, answering with the default mode.
    pub(crate) async fn start() -> Self {
        let state = Arc::new(State::default());
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind the fake AI listener");
        let port = listener.local_addr().expect("fake AI listener address").port();
        let app_state = web::Data::from(state.clone());
        let server = HttpServer::new(move || {
            App::new()
                .app_data(app_state.clone())
                .app_data(web::PayloadConfig::new(16 * 1024 * 1024))
                .route("/v1/chat/completions", web::post().to(chat_completions))
        })
        .workers(1)
        .disable_signals()
        .shutdown_timeout(0)
        .listen(listener)
        .expect("listen on the fake AI listener")
        .run();
        let handle = server.handle();
        tokio::spawn(server);
        Self { url: format!("http://127.0.0.1:{port}/v1"), port, state, server: handle }
    }

    pub(crate) fn set_mode(&self, mode: Mode) {
        *self.state.mode.lock().expect("fake AI mode lock") = mode;
    }

    /// The JSON bodies of the requests received so far, oldest first.
    pub(crate) fn requests(&self) -> Vec<Value> {
        self.recorded().into_iter().map(|request| request.body).collect()
    }

    /// The `Authorization` header of each request received so far, oldest first.
    pub(crate) fn authorizations(&self) -> Vec<Option<String>> {
        self.recorded().into_iter().map(|request| request.authorization).collect()
    }

    pub(crate) fn request_count(&self) -> usize {
        self.state.requests.lock().expect("fake AI requests lock").len()
    }

    fn recorded(&self) -> Vec<RecordedRequest> {
        self.state.requests.lock().expect("fake AI requests lock").clone()
    }
}

impl Drop for FakeAi {
    fn drop(&mut self) {
        // `stop` sends the command at once; the returned future only waits for completion.
        drop(self.server.stop(false));
    }
}

async fn chat_completions(state: web::Data<State>, request: HttpRequest, body: web::Bytes) -> HttpResponse {
    let authorization = request
        .headers()
        .get(actix_web::http::header::AUTHORIZATION)
        .map(|value| String::from_utf8_lossy(value.as_bytes()).into_owned());
    let body = serde_json::from_slice(&body).unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&body).into()));
    state.requests.lock().expect("fake AI requests lock").push(RecordedRequest { authorization, body });
    let mode = state.mode.lock().expect("fake AI mode lock").clone();
    match mode {
        Mode::Answer(value) => answer(&value),
        Mode::Refuse => completion(json!({
            "role": "assistant",
            "content": null,
            "refusal": "I can't help with that request.",
        })),
        Mode::Garbage => completion(json!({"role": "assistant", "content": "not json"})),
        Mode::Hang(duration) => {
            tokio::time::sleep(duration).await;
            answer(&json!("filled"))
        }
        Mode::Status(status) => error_status(status),
        Mode::Body(body) => HttpResponse::Ok().json(body),
    }
}

fn answer(value: &Value) -> HttpResponse {
    completion(json!({"role": "assistant", "content": json!({"value": value}).to_string()}))
}

fn completion(message: Value) -> HttpResponse {
    HttpResponse::Ok().json(json!({
        "id": "x",
        "object": "chat.completion",
        "choices": [{"index": 0, "finish_reason": "stop", "message": message}],
    }))
}

fn error_status(status: u16) -> HttpResponse {
    let status = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let (error_type, code) = match status.as_u16() {
        401 => ("invalid_request_error", "invalid_api_key"),
        429 => ("requests", "rate_limit_exceeded"),
        500..=599 => ("server_error", "server_error"),
        _ => ("invalid_request_error", "invalid_request"),
    };
    HttpResponse::build(status).json(json!({
        "error": {
            "message": format!("the fake AI answers {status}"),
            "type": error_type,
            "param": null,
            "code": code,
        }
    }))
}
