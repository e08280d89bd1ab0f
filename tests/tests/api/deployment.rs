//! The deployments: separate processes behind nginx routing by method, and single-node mode.

use std::process::Command;

use serde_json::json;

use crate::helpers::*;
use crate::log::wait_until_listening;

/// nginx in front of the services, stopped when dropped.
pub(crate) struct Nginx {
    prefix: std::path::PathBuf,
}

impl Drop for Nginx {
    fn drop(&mut self) {
        let _ = Command::new(nginx_binary())
            .args(["-p"])
            .arg(&self.prefix)
            .args(["-c", "nginx.conf", "-s", "stop"])
            .status();
    }
}

fn nginx_binary() -> &'static str {
    if std::path::Path::new("/usr/sbin/nginx").exists() { "/usr/sbin/nginx" } else { "nginx" }
}

/// Starts nginx from `deploy/nginx.conf.template` on `listen`, balancing over the command
/// services on `commands` and the query services on `queries` (loopback ports).
pub(crate) fn start_nginx(listen: u16, commands: &[u16], queries: &[u16]) -> Nginx {
    let scratch = std::env::var("TEST_SCRATCH").unwrap_or_else(|_| std::env::temp_dir().display().to_string());
    let prefix = std::path::PathBuf::from(scratch).join(format!("nginx-{listen}"));
    std::fs::create_dir_all(&prefix).expect("nginx prefix");
    let template = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../deploy/nginx.conf.template"))
        .expect("template");
    let servers = |ports: &[u16]| {
        ports.iter().map(|port| format!("server 127.0.0.1:{port};")).collect::<Vec<_>>().join("\n        ")
    };
    let config = template
        .replace("__PREFIX__", &prefix.display().to_string())
        .replace("server __COMMAND_ADDRESS__;", &servers(commands))
        .replace("server __QUERY_ADDRESS__;", &servers(queries))
        .replace("__LISTEN_ADDRESS__", &format!("127.0.0.1:{listen}"));
    let config = if nix_is_root() { format!("user root;\n{config}") } else { config };
    std::fs::write(prefix.join("nginx.conf"), config).expect("write config");
    let status = Command::new(nginx_binary())
        .arg("-p")
        .arg(&prefix)
        .args(["-c", "nginx.conf"])
        .status()
        .expect("nginx is installed (scripts/test installs it)");
    assert!(status.success(), "nginx started");
    Nginx { prefix }
}

fn nix_is_root() -> bool {
    Command::new("id").arg("-u").output().map(|out| String::from_utf8_lossy(&out.stdout).trim() == "0").unwrap_or(false)
}

#[tokio::test]
async fn the_split_deployment_routes_by_method_behind_nginx() {
    let database_url = create_database().await;
    let command_port = free_port();
    let query_port = free_port();
    let _projector = spawn_binary("projector", &["run"], &database_url, &[]);
    let _command =
        spawn_binary("command-service", &["serve"], &database_url, &[("APP__HTTP__PORT", command_port.to_string())]);
    let _query = spawn_binary("query-service", &[], &database_url, &[("APP__HTTP__PORT", query_port.to_string())]);
    let fixture = concat!(env!("CARGO_MANIFEST_DIR"), "/fixtures/workspace.json");
    let applied = Command::new(binaries_dir().join("command-service"))
        .args(["apply", fixture, "--wait"])
        .env("APP__DATABASE__URL", &database_url)
        .env("APP__MASTER_KEY", platform::crypto::TEST_MASTER_KEY)
        .env("RUST_LOG", "warn")
        .output()
        .expect("apply runs");
    assert!(applied.status.success(), "apply: {}", String::from_utf8_lossy(&applied.stderr));
    assert!(String::from_utf8_lossy(&applied.stdout).contains("applied"));
    let listen = free_port();
    let _nginx = start_nginx(listen, &[command_port], &[query_port]);
    let base = format!("http://127.0.0.1:{listen}/v1");
    let http = reqwest::Client::new();
    wait_until_listening(&http, &format!("http://127.0.0.1:{query_port}/v1")).await;
    wait_until_listening(&http, &format!("http://127.0.0.1:{command_port}/v1")).await;

    let created = http
        .post(format!("{base}/schemas/contacts/records"))
        .bearer_auth(ALPHA_ADMIN)
        .json(&json!({"email": "split@example.com"}))
        .send()
        .await
        .expect("post");
    assert_eq!(created.status().as_u16(), 201);
    let body: serde_json::Value = created.json().await.expect("json");
    let id = body["data"]["id"].as_str().expect("id");
    let fetched =
        http.get(format!("{base}/schemas/contacts/records/{id}")).bearer_auth(ALPHA_ADMIN).send().await.expect("get");
    assert_eq!(fetched.status().as_u16(), 200, "read-your-writes across processes");
    let me = http.get(format!("{base}/me")).bearer_auth(ALPHA_ADMIN).send().await.expect("me");
    assert_eq!(me.status().as_u16(), 200);
    let guard = http.patch(format!("{base}/events/ev_1")).send().await.expect("patch");
    assert_eq!(guard.status().as_u16(), 405);
    let wrong = http.delete(format!("{base}/schemas")).bearer_auth(ALPHA_ADMIN).send().await.expect("delete");
    assert_eq!(wrong.status().as_u16(), 405);
    // A double opt-in link is a GET that writes: nginx sends /v1/forms/ to the command service.
    let confirm = http
        .get(format!("{base}/forms/frm_unknown/confirm/token"))
        .header("Accept", "application/json")
        .send()
        .await
        .expect("confirm");
    assert_eq!(confirm.status().as_u16(), 404);
    let body: serde_json::Value = confirm.json().await.expect("json");
    assert_eq!(body["error"]["code"], "form_not_found", "answered by the command service");
}

#[tokio::test]
async fn single_node_serves_both_route_sets_on_one_base_url() {
    let database_url = create_database().await;
    let port = free_port();
    let fixture = concat!(env!("CARGO_MANIFEST_DIR"), "/fixtures/workspace.json");
    let _node =
        spawn_binary("platform", &["--workspace", fixture], &database_url, &[("APP__HTTP__PORT", port.to_string())]);
    let base = format!("http://127.0.0.1:{port}/v1");
    let http = reqwest::Client::new();
    wait_until_listening(&http, &base).await;
    let created = http
        .post(format!("{base}/schemas/contacts/records"))
        .bearer_auth(ALPHA_ADMIN)
        .json(&json!({"email": "single@example.com"}))
        .send()
        .await
        .expect("post");
    assert_eq!(created.status().as_u16(), 201);
    let body: serde_json::Value = created.json().await.expect("json");
    let id = body["data"]["id"].as_str().expect("id");
    let fetched =
        http.get(format!("{base}/schemas/contacts/records/{id}")).bearer_auth(ALPHA_ADMIN).send().await.expect("get");
    assert_eq!(fetched.status().as_u16(), 200);
    let wrong =
        http.put(format!("{base}/schemas/contacts/records")).bearer_auth(ALPHA_ADMIN).send().await.expect("put");
    assert_eq!(wrong.status().as_u16(), 405);
}
