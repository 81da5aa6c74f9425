//! Every route's happy path, in-process against the fake engine.

mod support;

use http::{Method, StatusCode};
use mayfly_engine::UploadSummary;
use mayfly_types::{
    Event, ExecAudit, ExecResult, FileKind, FileStat, ProcessInfo, ProcessOutput, ProcessState,
    SandboxInfo, SandboxList, SandboxState,
};
use support::*;

#[tokio::test]
async fn healthz_says_ok() {
    let (app, _) = test_app();
    let a = send(&app, empty_req(Method::GET, "/healthz")).await;
    assert_eq!(a.status, StatusCode::OK);
    assert_eq!(
        a.json::<serde_json::Value>(),
        serde_json::json!({"ok": true})
    );
}

#[tokio::test]
async fn create_returns_201_and_the_sandbox_is_listed_and_gettable() {
    let (app, fake) = test_app();
    let a = send(
        &app,
        json_req(
            Method::POST,
            "/v1/sandboxes",
            r#"{"template":"host","ttl_secs":60,"limits":{"pids":64},"labels":{"job":"ci"}}"#,
        ),
    )
    .await;
    assert_eq!(a.status, StatusCode::CREATED);
    let sb: SandboxInfo = a.json();
    assert_eq!(sb.limits.pids, 64);
    assert_eq!(sb.labels["job"], "ci");
    assert_eq!(fake.callers(), vec![format!("unix:uid={TEST_UID}")]);

    let got: SandboxInfo = send(
        &app,
        empty_req(Method::GET, &format!("/v1/sandboxes/{}", sb.id)),
    )
    .await
    .json();
    assert_eq!(got, sb);

    let list: SandboxList = send(&app, empty_req(Method::GET, "/v1/sandboxes"))
        .await
        .json();
    assert_eq!(list.sandboxes, vec![sb]);
}

#[tokio::test]
async fn create_with_an_empty_body_uses_defaults() {
    let (app, _) = test_app();
    let a = send(&app, empty_req(Method::POST, "/v1/sandboxes")).await;
    assert_eq!(a.status, StatusCode::CREATED, "{:?}", a.body);
}

#[tokio::test]
async fn destroy_is_idempotent_and_hides_the_sandbox_from_the_default_list() {
    let (app, _) = test_app();
    let sb = create(&app).await;
    let uri = format!("/v1/sandboxes/{}", sb.id);
    for _ in 0..2 {
        let a = send(&app, empty_req(Method::DELETE, &uri)).await;
        assert_eq!(a.status, StatusCode::OK);
        assert_eq!(a.json::<SandboxInfo>().state, SandboxState::Destroyed);
    }
    let live: SandboxList = send(&app, empty_req(Method::GET, "/v1/sandboxes"))
        .await
        .json();
    assert!(live.sandboxes.is_empty());
    let all: SandboxList = send(&app, empty_req(Method::GET, "/v1/sandboxes?all=true"))
        .await
        .json();
    assert_eq!(all.sandboxes.len(), 1);
}

#[tokio::test]
async fn an_unknown_but_well_formed_id_is_the_engines_404() {
    let (app, _) = test_app();
    let a = send(
        &app,
        empty_req(Method::GET, "/v1/sandboxes/mf-abcdefghjkmn"),
    )
    .await;
    let e = a.api_error(404);
    assert!(e.message.contains("mf-abcdefghjkmn"), "{e:?}");
}

#[tokio::test]
async fn buffered_exec_returns_base64_output_and_records_the_caller() {
    let (app, fake) = test_app();
    let sb = create(&app).await;
    let a = send(
        &app,
        json_req(
            Method::POST,
            &format!("/v1/sandboxes/{}/exec", sb.id),
            r#"{"argv":["cat"],"stdin":"AAH/"}"#,
        ),
    )
    .await;
    assert_eq!(a.status, StatusCode::OK);
    let raw: serde_json::Value = a.json();
    assert_eq!(raw["stdout"], "AAH/", "stdout travels as base64");
    let r: ExecResult = a.json();
    assert_eq!(r.stdout.0, vec![0, 1, 255]);
    assert_eq!(r.status.exit_code, Some(0));

    let audit: Vec<ExecAudit> = send(
        &app,
        empty_req(Method::GET, &format!("/v1/sandboxes/{}/audit", sb.id)),
    )
    .await
    .json();
    assert_eq!(audit.len(), 1);
    assert_eq!(audit[0].argv, vec!["cat"]);
    assert_eq!(audit[0].caller, format!("unix:uid={TEST_UID}"));
    assert_eq!(fake.callers().len(), 2);
}

#[tokio::test]
async fn a_command_that_cannot_start_is_422() {
    let (app, _) = test_app();
    let sb = create(&app).await;
    let a = send(
        &app,
        json_req(
            Method::POST,
            &format!("/v1/sandboxes/{}/exec", sb.id),
            r#"{"argv":["nosuch"]}"#,
        ),
    )
    .await;
    assert_eq!(a.api_error(422).code, mayfly_types::ErrorCode::ExecFailed);
}

#[tokio::test]
async fn exec_in_a_destroyed_sandbox_is_409() {
    let (app, _) = test_app();
    let sb = create(&app).await;
    send(
        &app,
        empty_req(Method::DELETE, &format!("/v1/sandboxes/{}", sb.id)),
    )
    .await;
    let a = send(
        &app,
        json_req(
            Method::POST,
            &format!("/v1/sandboxes/{}/exec", sb.id),
            r#"{"argv":["echo"]}"#,
        ),
    )
    .await;
    a.api_error(409);
}

#[tokio::test]
async fn background_processes_start_list_wait_read_and_die() {
    let (app, _) = test_app();
    let sb = create(&app).await;
    let base = format!("/v1/sandboxes/{}/processes", sb.id);
    let a = send(
        &app,
        json_req(Method::POST, &base, r#"{"argv":["sleep","9"]}"#),
    )
    .await;
    assert_eq!(a.status, StatusCode::CREATED);
    let p: ProcessInfo = a.json();
    assert_eq!(p.state, ProcessState::Running);

    let list: Vec<ProcessInfo> = send(&app, empty_req(Method::GET, &base)).await.json();
    assert_eq!(list, vec![p.clone()]);

    let still: ProcessInfo = send(
        &app,
        empty_req(
            Method::POST,
            &format!("{base}/{}/wait?timeout_ms=0", p.handle),
        ),
    )
    .await
    .json();
    assert_eq!(still.state, ProcessState::Running);

    let out: ProcessOutput = send(
        &app,
        empty_req(Method::GET, &format!("{base}/{}/output", p.handle)),
    )
    .await
    .json();
    assert_eq!(out.stdout.0, b"sleep 9");

    let killed: ProcessInfo = send(
        &app,
        json_req(
            Method::POST,
            &format!("{base}/{}/kill", p.handle),
            r#"{"signal":15}"#,
        ),
    )
    .await
    .json();
    assert_eq!(killed.status.and_then(|s| s.signal), Some(15));

    let waited = send(
        &app,
        empty_req(Method::POST, &format!("{base}/{}/wait", p.handle)),
    )
    .await;
    assert_eq!(waited.json::<ProcessInfo>().state, ProcessState::Exited);
}

#[tokio::test]
async fn kill_with_no_body_sends_sigkill() {
    let (app, _) = test_app();
    let sb = create(&app).await;
    let base = format!("/v1/sandboxes/{}/processes", sb.id);
    let p: ProcessInfo = send(&app, json_req(Method::POST, &base, r#"{"argv":["x"]}"#))
        .await
        .json();
    let a = send(
        &app,
        empty_req(Method::POST, &format!("{base}/{}/kill", p.handle)),
    )
    .await;
    assert_eq!(a.status, StatusCode::OK, "{:?}", a.body);
    assert_eq!(
        a.json::<ProcessInfo>().status.and_then(|s| s.signal),
        Some(9)
    );
}

#[tokio::test]
async fn an_unknown_process_handle_is_404() {
    let (app, _) = test_app();
    let sb = create(&app).await;
    let a = send(
        &app,
        empty_req(
            Method::GET,
            &format!("/v1/sandboxes/{}/processes/77/output", sb.id),
        ),
    )
    .await;
    a.api_error(404);
}

#[tokio::test]
async fn files_are_written_read_stated_listed_renamed_and_removed() {
    let (app, _) = test_app();
    let sb = create(&app).await;
    let files = format!("/v1/sandboxes/{}/files", sb.id);
    let binary: Vec<u8> = (0..=255u8).collect();

    let put = req(
        Method::PUT,
        &format!("{files}?path=/work/a%20b.bin&mode=0600"),
    )
    .body(axum::body::Body::from(binary.clone()))
    .expect("valid request");
    let a = send(&app, put).await;
    assert_eq!(a.status, StatusCode::OK, "{:?}", a.body);
    let st: FileStat = a.json();
    assert_eq!(
        (st.name.as_str(), st.size, st.mode),
        ("/work/a b.bin", 256, 0o600)
    );

    let a = send(
        &app,
        empty_req(Method::GET, &format!("{files}?path=/work/a%20b.bin")),
    )
    .await;
    assert_eq!(a.status, StatusCode::OK);
    assert_eq!(a.headers["content-type"], "application/octet-stream");
    assert_eq!(
        a.body.as_ref(),
        binary.as_slice(),
        "bytes round-trip exactly"
    );

    let st: FileStat = send(
        &app,
        empty_req(Method::GET, &format!("{files}/stat?path=/work/a%20b.bin")),
    )
    .await
    .json();
    assert_eq!(st.kind, FileKind::File);

    let mk = send(
        &app,
        json_req(
            Method::POST,
            &format!("{files}/mkdir"),
            r#"{"path":"/work","parents":true}"#,
        ),
    )
    .await;
    assert_eq!(mk.json::<FileStat>().kind, FileKind::Dir);

    let ls: Vec<FileStat> = send(
        &app,
        empty_req(Method::GET, &format!("{files}/list?path=/work")),
    )
    .await
    .json();
    assert_eq!(
        ls.iter().map(|f| f.name.as_str()).collect::<Vec<_>>(),
        ["a b.bin"]
    );

    let mv = send(
        &app,
        json_req(
            Method::POST,
            &format!("{files}/rename"),
            r#"{"from":"/work/a b.bin","to":"/work/c"}"#,
        ),
    )
    .await;
    assert_eq!(mv.status, StatusCode::NO_CONTENT);

    let rm = send(
        &app,
        empty_req(
            Method::DELETE,
            &format!("{files}?path=/work&recursive=true"),
        ),
    )
    .await;
    assert_eq!(rm.status, StatusCode::NO_CONTENT);
    assert!(rm.body.is_empty());
}

#[tokio::test]
async fn archives_upload_and_download_as_tar() {
    let (app, _) = test_app();
    let sb = create(&app).await;
    let uri = format!("/v1/sandboxes/{}/archive?path=/workspace", sb.id);
    let put = req(Method::PUT, &uri)
        .header("content-type", "application/x-tar")
        .body(axum::body::Body::from(vec![7u8; 1024]))
        .expect("valid request");
    let a = send(&app, put).await;
    assert_eq!(a.status, StatusCode::OK, "{:?}", a.body);
    assert_eq!(a.json::<UploadSummary>().bytes, 1024);

    let a = send(&app, empty_req(Method::GET, &uri)).await;
    assert_eq!(a.status, StatusCode::OK);
    assert_eq!(a.headers["content-type"], "application/x-tar");
    assert_eq!(a.body.len(), 1024);
}

#[tokio::test]
async fn events_page_by_sequence_number() {
    let (app, _) = test_app();
    for _ in 0..3 {
        create(&app).await;
    }
    let all: Vec<Event> = send(&app, empty_req(Method::GET, "/v1/events"))
        .await
        .json();
    assert_eq!(all.iter().map(|e| e.seq).collect::<Vec<_>>(), [1, 2, 3]);
    let page: Vec<Event> = send(&app, empty_req(Method::GET, "/v1/events?since=1&limit=1"))
        .await
        .json();
    assert_eq!(page.iter().map(|e| e.seq).collect::<Vec<_>>(), [2]);
}

#[tokio::test]
async fn internal_errors_are_500_with_a_generic_message() {
    let (app, _) = test_app();
    let sb = create(&app).await;
    let a = send(
        &app,
        empty_req(
            Method::GET,
            &format!("/v1/sandboxes/{}/files?path=/internal", sb.id),
        ),
    )
    .await;
    let e = a.api_error(500);
    assert!(
        !e.message.contains("secret"),
        "internal detail leaked: {e:?}"
    );
}

#[tokio::test]
async fn a_panicking_handler_becomes_a_json_500() {
    let (app, _) = test_app();
    let sb = create(&app).await;
    let a = send(
        &app,
        empty_req(
            Method::GET,
            &format!("/v1/sandboxes/{}/files?path=/panic", sb.id),
        ),
    )
    .await;
    a.api_error(500);
    // And the router still serves afterwards.
    let a = send(&app, empty_req(Method::GET, "/healthz")).await;
    assert_eq!(a.status, StatusCode::OK);
}

#[tokio::test]
async fn openapi_json_is_served() {
    let (app, _) = test_app();
    let a = send(&app, empty_req(Method::GET, "/openapi.json")).await;
    assert_eq!(a.status, StatusCode::OK);
    let doc: serde_json::Value = a.json();
    assert!(doc["openapi"].as_str().is_some_and(|v| v.starts_with("3.")));
    assert!(doc["paths"]["/v1/sandboxes/{id}/exec"]["post"].is_object());
}
