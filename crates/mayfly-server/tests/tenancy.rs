//! API keys, tenant isolation, the admin API and quota answers, in-process
//! against the fake engine (whose keys live in a real in-memory store).

mod support;

use axum::body::Body;
use axum::extract::ConnectInfo;
use axum::Router;
use http::{Method, Request, StatusCode};
use mayfly_server::{route_table, Peer, ServerOptions};
use mayfly_types::{
    CreatedKey, Event, KeyInfo, KeyList, SandboxId, SandboxInfo, SandboxList, TenantInfo,
    TenantList,
};
use support::*;

/// `r` as sent with `Authorization: Bearer <key>` over the unix socket.
async fn send_key(app: &Router, mut r: Request<Body>, key: &str) -> Answer {
    r.headers_mut().insert(
        "authorization",
        format!("Bearer {key}").parse().expect("a header value"),
    );
    send(app, r).await
}

async fn create_as(app: &Router, key: &str) -> SandboxInfo {
    let a = send_key(app, json_req(Method::POST, "/v1/sandboxes", "{}"), key).await;
    assert_eq!(a.status, StatusCode::CREATED, "{:?}", a.body);
    a.json()
}

/// Every route that names one sandbox, with `{id}` (and `{handle}`) filled in.
fn sandbox_routes(id: &SandboxId) -> Vec<(Method, String)> {
    route_table()
        .into_iter()
        .filter(|(_, p)| p.starts_with("/v1/sandboxes/{id}"))
        .map(|(m, p)| (m, p.replace("{id}", id.as_str()).replace("{handle}", "1")))
        .collect()
}

#[tokio::test]
async fn a_key_acts_for_its_tenant_and_is_named_by_its_id_in_the_audit() {
    let (app, fake) = test_app();
    let key = fake.make_key("acme", false);
    let sb = create_as(&app, &key).await;
    assert_eq!(sb.tenant.as_deref(), Some("acme"));
    let id = &key["mfk_".len().."mfk_".len() + 12];
    assert_eq!(fake.callers(), vec![format!("key:{id}")]);
    // The unix socket without a key is still the host's operator.
    let own = create(&app).await;
    assert_eq!(own.tenant.as_deref(), Some("default"));
}

#[tokio::test]
async fn a_key_works_on_tcp_and_the_daemon_token_stays_the_host_operator() {
    let (app, fake) = test_app_with(ServerOptions {
        tcp_token: Some("s3cret".into()),
        ..ServerOptions::default()
    });
    let key = fake.make_key("acme", false);
    let tcp = |bearer: &str, method: Method, uri: &str| {
        let mut r = json_req(method, uri, "{}");
        r.headers_mut()
            .insert("authorization", format!("Bearer {bearer}").parse().unwrap());
        r.extensions_mut().insert(ConnectInfo(Peer::Tcp {
            addr: "127.0.0.1:9".parse().unwrap(),
        }));
        r
    };
    let a = send_raw(&app, tcp(&key, Method::POST, "/v1/sandboxes")).await;
    assert_eq!(a.status, StatusCode::CREATED);
    assert_eq!(a.json::<SandboxInfo>().tenant.as_deref(), Some("acme"));
    let a = send_raw(&app, tcp(&key, Method::GET, "/v1/tenants")).await;
    a.api_error(403);
    let a = send_raw(&app, tcp("s3cret", Method::GET, "/v1/tenants")).await;
    assert_eq!(a.status, StatusCode::OK, "the daemon's token is admin");
}

#[tokio::test]
async fn wrong_malformed_and_revoked_keys_get_a_json_401() {
    let (app, fake) = test_app();
    let key = fake.make_key("acme", false);
    let last = if key.ends_with('0') { '1' } else { '0' };
    let wrong = format!("{}{last}", &key[..key.len() - 1]);
    for bad in [
        wrong.as_str(),
        "mfk_",
        "mfk_nothex_nothex",
        &format!("{key}0"),
    ] {
        let a = send_key(&app, empty_req(Method::GET, "/v1/sandboxes"), bad).await;
        let e = a.api_error(401);
        assert_eq!(e.message, "the API key is not valid", "{bad}");
        assert_eq!(a.headers["www-authenticate"], "Bearer");
    }
    let id = key["mfk_".len().."mfk_".len() + 12].to_owned();
    let a = send(&app, empty_req(Method::DELETE, &format!("/v1/keys/{id}"))).await;
    assert_eq!(a.status, StatusCode::OK);
    assert!(a.json::<KeyInfo>().revoked_at.is_some());
    let a = send_key(&app, empty_req(Method::GET, "/v1/sandboxes"), &key).await;
    let e = a.api_error(401);
    assert!(e.message.contains("revoked"), "{e:?}");
    assert!(
        !e.message.contains(&key[17..]),
        "the secret is never echoed"
    );
}

#[tokio::test]
async fn another_tenants_sandbox_answers_exactly_like_a_missing_one() {
    let (app, fake) = test_app();
    let (ka, kb) = (fake.make_key("a", false), fake.make_key("b", false));
    let sb = create_as(&app, &ka).await;
    let missing: SandboxId = "mf-zzzzzzzzzzzz".parse().unwrap();
    for ((method, theirs), (_, nowhere)) in sandbox_routes(&sb.id)
        .into_iter()
        .zip(sandbox_routes(&missing))
    {
        let a = send_key(&app, json_req(method.clone(), &theirs, "{}"), &kb).await;
        let e = a.api_error(404);
        let m = send_key(&app, json_req(method.clone(), &nowhere, "{}"), &kb).await;
        let expected = m.api_error(404);
        assert_eq!(
            e.message,
            expected.message.replace(missing.as_str(), sb.id.as_str()),
            "{method} {theirs}"
        );
        assert_eq!(e.code, expected.code);
    }
    // Tenant b touched nothing: the sandbox is still there for a.
    let a = send_key(
        &app,
        empty_req(Method::GET, &format!("/v1/sandboxes/{}", sb.id)),
        &ka,
    )
    .await;
    assert_eq!(a.status, StatusCode::OK);
    assert_eq!(
        a.json::<SandboxInfo>().state,
        mayfly_types::SandboxState::Ready
    );
}

#[tokio::test]
async fn unclaimed_pool_sandboxes_are_invisible_to_tenants_but_not_to_admins() {
    let (app, fake) = test_app();
    let key = fake.make_key("a", false);
    create_as(&app, &key).await;
    let pooled: SandboxId = "mf-pppppppppppp".parse().unwrap();
    fake.insert_unclaimed(pooled.clone());
    let uri = format!("/v1/sandboxes/{pooled}");
    send_key(&app, empty_req(Method::GET, &uri), &key)
        .await
        .api_error(404);
    let list: SandboxList = send_key(&app, empty_req(Method::GET, "/v1/sandboxes"), &key)
        .await
        .json();
    assert!(list.sandboxes.iter().all(|s| s.id != pooled));
    let a = send(&app, empty_req(Method::GET, &uri)).await;
    assert_eq!(a.status, StatusCode::OK);
}

#[tokio::test]
async fn lists_and_events_show_a_tenant_only_its_own_and_an_admin_everything() {
    let (app, fake) = test_app();
    let (ka, kb) = (fake.make_key("a", false), fake.make_key("b", false));
    let admin_b = fake.make_key("b", true);
    let a1 = create_as(&app, &ka).await;
    let b1 = create_as(&app, &kb).await;
    let host = create(&app).await;
    let ids = |key: &str, uri: &'static str| {
        let app = app.clone();
        let key = key.to_owned();
        async move {
            let l: SandboxList = send_key(&app, empty_req(Method::GET, uri), &key)
                .await
                .json();
            l.sandboxes.into_iter().map(|s| s.id).collect::<Vec<_>>()
        }
    };
    assert_eq!(ids(&ka, "/v1/sandboxes").await, vec![a1.id.clone()]);
    assert_eq!(
        ids(&kb, "/v1/sandboxes?all=true").await,
        vec![b1.id.clone()]
    );
    let mut all = ids(&admin_b, "/v1/sandboxes").await;
    all.sort();
    let mut expected = vec![a1.id.clone(), b1.id.clone(), host.id.clone()];
    expected.sort();
    assert_eq!(
        all, expected,
        "an admin key of any tenant sees every sandbox"
    );

    let events = |key: String| {
        let app = app.clone();
        async move {
            let e: Vec<Event> = send_key(&app, empty_req(Method::GET, "/v1/events"), &key)
                .await
                .json();
            e.into_iter()
                .filter_map(|e| e.sandbox_id)
                .collect::<Vec<_>>()
        }
    };
    assert_eq!(events(ka.clone()).await, vec![a1.id.to_string()]);
    assert_eq!(events(kb.clone()).await, vec![b1.id.to_string()]);
    assert_eq!(events(admin_b).await.len(), 3);
}

#[tokio::test]
async fn a_non_admin_key_gets_403_on_every_admin_route() {
    let (app, fake) = test_app();
    let key = fake.make_key("a", false);
    let admin_routes: Vec<_> = route_table()
        .into_iter()
        .filter(|(_, p)| p.starts_with("/v1/tenants") || p.starts_with("/v1/keys"))
        .collect();
    assert_eq!(admin_routes.len(), 7);
    for (method, path) in admin_routes {
        let uri = path.replace("{name}", "a").replace("{id}", "0123456789ab");
        let body = r#"{"tenant":"a","admin":true}"#;
        let a = send_key(&app, json_req(method.clone(), &uri, body), &key).await;
        let e = a.api_error(403);
        assert!(e.message.contains("admin"), "{method} {path}: {e:?}");
    }
    // Nothing was changed by the refused calls.
    let keys: KeyList = send(&app, empty_req(Method::GET, "/v1/keys")).await.json();
    assert_eq!(keys.keys.len(), 1);
    assert!(keys.keys[0].revoked_at.is_none());
}

#[tokio::test]
async fn an_admin_manages_tenants_and_keys_and_secrets_are_shown_once() {
    let (app, _) = test_app();
    let a = send(
        &app,
        json_req(
            Method::PUT,
            "/v1/tenants/acme",
            r#"{"max_live":2,"max_memory_bytes":1073741824}"#,
        ),
    )
    .await;
    assert_eq!(a.status, StatusCode::OK, "{:?}", a.body);
    let t: TenantInfo = a.json();
    assert_eq!(t.quotas.max_live, Some(2));
    assert_eq!(t.usage.live, 0);

    let a = send(
        &app,
        json_req(Method::POST, "/v1/keys", r#"{"tenant":"acme"}"#),
    )
    .await;
    assert_eq!(a.status, StatusCode::CREATED);
    let k: CreatedKey = a.json();
    assert!(k.secret.starts_with("mfk_") && !k.key.admin);

    // The new key works, and its sandbox shows in the tenant's usage.
    create_as(&app, &k.secret).await;
    let t: TenantInfo = send(&app, empty_req(Method::GET, "/v1/tenants/acme"))
        .await
        .json();
    assert_eq!(t.usage.live, 1);
    assert_eq!(t.usage.memory_bytes, 512 << 20);

    // Listing never shows a secret.
    let a = send(&app, empty_req(Method::GET, "/v1/keys")).await;
    let text = String::from_utf8_lossy(&a.body).into_owned();
    assert!(text.contains(&k.key.id));
    assert!(!text.contains(&k.secret[17..]), "a listing leaks a secret");

    let list: TenantList = send(&app, empty_req(Method::GET, "/v1/tenants"))
        .await
        .json();
    let names: Vec<_> = list.tenants.iter().map(|t| t.name.as_str()).collect();
    assert_eq!(names, ["acme", "default"]);

    // A tenant with a live sandbox stays; the default tenant always does.
    send(&app, empty_req(Method::DELETE, "/v1/tenants/acme"))
        .await
        .api_error(409);
    send(&app, empty_req(Method::DELETE, "/v1/tenants/default"))
        .await
        .api_error(409);
    // An empty tenant goes, with its keys.
    send(&app, empty_req(Method::PUT, "/v1/tenants/empty")).await;
    let k2: CreatedKey = send(
        &app,
        json_req(
            Method::POST,
            "/v1/keys",
            r#"{"tenant":"empty","admin":true}"#,
        ),
    )
    .await
    .json();
    let a = send(&app, empty_req(Method::DELETE, "/v1/tenants/empty")).await;
    assert_eq!(a.status, StatusCode::NO_CONTENT);
    send(&app, empty_req(Method::GET, "/v1/tenants/empty"))
        .await
        .api_error(404);
    send_key(&app, empty_req(Method::GET, "/v1/sandboxes"), &k2.secret)
        .await
        .api_error(401);
    // Unknown tenants and keys are 404s.
    send(
        &app,
        json_req(Method::POST, "/v1/keys", r#"{"tenant":"ghost"}"#),
    )
    .await
    .api_error(404);
    send(&app, empty_req(Method::DELETE, "/v1/keys/0123456789ab"))
        .await
        .api_error(404);
}

#[tokio::test]
async fn bad_admin_input_is_a_json_400_never_a_500() {
    let (app, _) = test_app();
    for name in ["Acme", "-x", "a%20b", "a%2Fb", "%C3%A9", &"x".repeat(64)] {
        for method in [Method::GET, Method::PUT, Method::DELETE] {
            let a = send(
                &app,
                empty_req(method.clone(), &format!("/v1/tenants/{name}")),
            )
            .await;
            let e = a.api_error(400);
            assert!(e.message.contains("tenant name"), "{method} {name}: {e:?}");
        }
    }
    for body in [
        r#"{"max_live":-1}"#,
        r#"{"max_live":"3"}"#,
        r#"{"max_lives":3}"#,
        r#"{"max_live":4294967296}"#,
        r#"{"max_live":1000001}"#,
        r#"{"max_memory_bytes":18446744073709551615}"#,
        r#"{"#,
        "[]",
    ] {
        let a = send(&app, json_req(Method::PUT, "/v1/tenants/acme", body)).await;
        a.api_error(400);
    }
    for body in [
        r#"{}"#,
        r#"{"tenant":"Bad Name"}"#,
        r#"{"tenant":"acme","admin":"yes"}"#,
        r#"{"tenant":"acme","extra":1}"#,
        r#"{"tenant":7}"#,
    ] {
        let a = send(&app, json_req(Method::POST, "/v1/keys", body)).await;
        a.api_error(400);
    }
    for id in ["x", "0123456789AB", "0123456789abc", "mfk_0123456789ab"] {
        let a = send(&app, empty_req(Method::DELETE, &format!("/v1/keys/{id}"))).await;
        a.api_error(400);
    }
    // Nothing was made.
    let list: TenantList = send(&app, empty_req(Method::GET, "/v1/tenants"))
        .await
        .json();
    assert_eq!(list.tenants.len(), 1);
}

#[tokio::test]
async fn a_quota_refusal_is_a_429_with_retry_after() {
    let (app, fake) = test_app();
    let key = fake.make_key("acme", false);
    send(
        &app,
        json_req(Method::PUT, "/v1/tenants/acme", r#"{"max_live":1}"#),
    )
    .await;
    create_as(&app, &key).await;
    let a = send_key(&app, json_req(Method::POST, "/v1/sandboxes", "{}"), &key).await;
    let e = a.api_error(429);
    assert_eq!(e.code, mayfly_types::ErrorCode::ResourceExhausted);
    assert!(e.message.contains("quota of 1 live"), "{e:?}");
    let secs: u64 = a.headers["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .expect("Retry-After is a number of seconds");
    assert!(secs >= 1);
}
