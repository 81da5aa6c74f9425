//! Request-level routing (the shared-baseline pattern) against a real
//! daemon: baseline servers on the host, sandboxes overriding services,
//! routing keys in `X-Mayfly-Sandbox` and in W3C `baggage`, requests
//! without a key or with an unknown one, a two-hop chain through the
//! gateway inside a sandbox, overrides that go with their sandbox, and
//! routes that outlive the daemon (CLI).

mod common;
#[path = "gateway/support.rs"]
mod support;

use common::expect_exit;
use mayfly_types::SandboxId;
use support::{curl, daemon, sandbox_serving, serve_in, HostServer};

/// A request for `service` through the gateway with extra headers.
fn ask(gw: u16, service: &str, path: &str, headers: &[String]) -> (u16, String) {
    let url = format!("http://127.0.0.1:{gw}{path}");
    let svc = format!("X-Mayfly-Service: {service}");
    let mut args = vec!["-H", svc.as_str()];
    args.extend(headers.iter().flat_map(|h| ["-H", h.as_str()]));
    curl(&url, &args)
}

fn key(id: &SandboxId) -> String {
    format!("X-Mayfly-Sandbox: {id}")
}

fn baggage(id: &SandboxId) -> String {
    // Other members, properties and whitespace, as real propagators send.
    format!("baggage: userid=alice, mayfly-sandbox = {id};ttl=30 ,sampled=1")
}

#[tokio::test]
async fn routing_keys_choose_the_overriding_sandbox_and_everything_else_the_baseline() {
    let (d, gw) = daemon().await;
    let gateway = format!("127.0.0.1:{gw}");
    let base_api = HostServer::start("base-api", None);
    let base_front = HostServer::start("base-front", Some(&gateway));
    d.client.put_route("api", &base_api.url()).await.unwrap();
    d.client
        .put_route("front", &base_front.url())
        .await
        .unwrap();

    // sb1 overrides both services; its `front` calls `api` through the
    // gateway inside its own namespace. sb2 overrides `api` only; sb3
    // overrides nothing.
    let sb1 = sandbox_serving(&d, "sb1-api", 8001, None).await;
    serve_in(&d, &sb1, "sb1-front", 8002, Some("127.0.0.1:15080")).await;
    d.client.set_override(&sb1, "api", 8001).await.unwrap();
    d.client.set_override(&sb1, "front", 8002).await.unwrap();
    let sb2 = sandbox_serving(&d, "sb2-api", 8001, None).await;
    d.client.set_override(&sb2, "api", 8001).await.unwrap();
    let sb3 = sandbox_serving(&d, "sb3-api", 8001, None).await;

    let hello = |who: &str| (200, format!("hello from {who}"));
    assert_eq!(ask(gw, "api", "/", &[]), hello("base-api"), "no key");
    assert_eq!(ask(gw, "api", "/", &[key(&sb1)]), hello("sb1-api"));
    assert_eq!(ask(gw, "api", "/", &[key(&sb2)]), hello("sb2-api"));
    assert_eq!(ask(gw, "api", "/", &[baggage(&sb1)]), hello("sb1-api"));
    assert_eq!(ask(gw, "api", "/", &[baggage(&sb2)]), hello("sb2-api"));
    let encoded = format!(
        "baggage: mayfly-sandbox={}",
        sb2.as_str().replace('-', "%2D")
    );
    assert_eq!(
        ask(gw, "api", "/", &[encoded]),
        hello("sb2-api"),
        "percent-encoded"
    );
    // Host-based service naming.
    let url = format!("http://api.localhost:{gw}/");
    assert_eq!(curl(&url, &["-H", &baggage(&sb2)]), hello("sb2-api"));
    // Unknown keys, junk and a sandbox without the override: the baseline.
    for h in [
        "X-Mayfly-Sandbox: mf-zzzzzzzzzzzz".to_owned(),
        "X-Mayfly-Sandbox: not-an-id".to_owned(),
        "baggage: mayfly-sandbox=%%%".to_owned(),
        key(&sb3),
        baggage(&sb3),
    ] {
        assert_eq!(
            ask(gw, "api", "/", std::slice::from_ref(&h)),
            hello("base-api"),
            "{h}"
        );
    }
    // The baseline gets the request unchanged, key included.
    let (_, seen) = ask(gw, "api", "/headers", &[baggage(&sb3)]);
    assert!(seen.contains(&format!("mayfly-sandbox = {sb3}")), "{seen}");

    // Two hops: front calls api through the gateway, forwarding baggage.
    let chain = |h: &[String]| ask(gw, "front", "/call/api", h).1;
    assert_eq!(
        chain(&[baggage(&sb1)]),
        "sb1-front>hello from sb1-api",
        "both hops in sb1"
    );
    assert_eq!(
        chain(&[baggage(&sb2)]),
        "base-front>hello from sb2-api",
        "baseline, then sb2"
    );
    assert_eq!(
        chain(&[]),
        "base-front>hello from base-api",
        "no key: baseline twice"
    );

    // Inside a sandbox, a request without a key goes to the baseline, and
    // the in-sandbox gateway serves services only.
    let inside = d
        .sh(
            &sb1,
            "python3 -c \"import http.client as h; c=h.HTTPConnection('127.0.0.1',15080); \
             c.request('GET','/',headers={'X-Mayfly-Service':'api'}); print(c.getresponse().read().decode()); \
             c=h.HTTPConnection('127.0.0.1',15080); \
             c.request('GET','/',headers={'X-Mayfly-Sandbox':'$(hostname)','X-Mayfly-Port':'8001'}); \
             print(c.getresponse().status)\"",
        )
        .await;
    assert_eq!(inside, "hello from base-api\n404\n");

    // Overrides go when removed, and with their sandbox.
    d.client.remove_override(&sb2, "api").await.unwrap();
    assert_eq!(ask(gw, "api", "/", &[key(&sb2)]), hello("base-api"));
    d.client.destroy(&sb1).await.unwrap();
    assert_eq!(ask(gw, "api", "/", &[key(&sb1)]), hello("base-api"));
    assert_eq!(chain(&[baggage(&sb1)]), "base-front>hello from base-api");

    // A baseline that is down: a clean 502.
    drop(base_api);
    let (s, b) = ask(gw, "api", "/", &[]);
    assert_eq!(
        (s, support::error_code(&b).as_str()),
        (502, "bad_gateway"),
        "{b}"
    );
}

#[tokio::test]
async fn routes_and_overrides_from_the_cli_and_routes_outlive_the_daemon() {
    let (mut d, gw) = daemon().await;
    let base = HostServer::start("base-web", None);
    let out = d.run_cli(&["route", "add", "web", &base.url()]);
    expect_exit(&out, 0, "route add");
    let out = d.run_cli(&["route", "add", "web2", "https://nope"]);
    assert_ne!(out.status.code(), Some(0), "a bad URL is refused");
    let sb = sandbox_serving(&d, "sb-web", 8001, None).await;
    let out = d.run_cli(&["sandbox", "override", sb.as_str(), "web", "8001"]);
    expect_exit(&out, 0, "sandbox override");
    let out = d.run_cli(&["ports", sb.as_str()]);
    let text = expect_exit(&out, 0, "ports");
    assert!(text.contains("web") && text.contains("8001"), "{text}");
    assert_eq!(ask(gw, "web", "/", &[key(&sb)]).1, "hello from sb-web");
    let out = d.run_cli(&["sandbox", "override", sb.as_str(), "web", "--rm"]);
    expect_exit(&out, 0, "override --rm");
    assert_eq!(ask(gw, "web", "/", &[key(&sb)]).1, "hello from base-web");

    d.kill9();
    d.restart().await;
    let out = d.run_cli(&["route", "ls"]);
    let text = expect_exit(&out, 0, "route ls");
    assert!(text.contains("web") && text.contains(&base.url()), "{text}");
    assert_eq!(
        ask(gw, "web", "/", &[]).1,
        "hello from base-web",
        "served after a restart"
    );
    let out = d.run_cli(&["route", "rm", "web"]);
    expect_exit(&out, 0, "route rm");
    assert_eq!(ask(gw, "web", "/", &[]).0, 404);
    let out = d.run_cli(&["route", "rm", "web"]);
    assert_ne!(out.status.code(), Some(0), "removing a missing route fails");
}
