//! Registry pulls with bearer-token auth: Debian's `docker-registry` with
//! `auth: token`, whose realm is a token server this test runs on loopback
//! (`common::token_server`: RS256 JWTs with an `x5c` header, signed with a
//! key whose certificate is the registry's `rootcertbundle`). The token
//! server checks the build's credentials (basic auth on the token request).
//!
//! Needs root and the tools `umoci`, `skopeo`, `docker-registry` and
//! `openssl`; a missing one fails the test.

mod common;

use common::token_server::TokenServer;
use common::{assert_merged, build_image, fetch, layer_store, need_root, tmp_is_empty, Registry};
use mayfly_engine::image::{ImageError, ImageSource, PullOptions};
use mayfly_types::RegistryAuth;

fn with(user: &str, password: &str) -> PullOptions {
    PullOptions {
        auth: Some(RegistryAuth {
            username: user.into(),
            password: password.into(),
        }),
        insecure: Vec::new(),
    }
}

#[tokio::test]
async fn registry_token_auth_pulls_with_the_right_credentials_and_refuses_others_clearly() {
    need_root();
    let t = tempfile::tempdir().unwrap();
    let layout = build_image(t.path());
    let tokens = TokenServer::start(t.path(), "mayfly", "t0ken-s3cret");
    let registry = Registry::start(|_| tokens.registry_auth());

    // The registry asks for a token, not for basic auth.
    let challenge = common::run(
        "curl",
        &[
            "-s",
            "-o",
            "/dev/null",
            "-D",
            "-",
            &format!("http://127.0.0.1:{}/v2/", registry.port),
        ],
    );
    assert!(
        challenge.contains("401") && challenge.contains("Bearer realm="),
        "the registry does not ask for a bearer token: {challenge}"
    );

    // skopeo pushes through the same token flow (pull,push scope).
    let reference = registry.push(&layout, "private/app:v1", Some("mayfly:t0ken-s3cret"));
    assert!(
        tokens.requests().iter().any(|r| r.granted),
        "skopeo pushed without a token: {:?}; registry log:\n{}",
        tokens.requests(),
        registry.log()
    );
    let src = ImageSource::parse(&format!("docker://{reference}"))
        .unwrap()
        .unwrap();
    let store = layer_store(t.path());

    // Wrong password: the token server refuses it, and so the registry.
    let before = tokens.requests().len();
    let (wrong, _) = fetch(&src, &store, &with("mayfly", "nope")).await;
    match &wrong {
        Err(e @ ImageError::Unauthorized { registry: r, .. }) => {
            assert_eq!(r, &format!("127.0.0.1:{}", registry.port));
            assert!(e.to_string().contains("refused the credentials"), "{e}");
            eprintln!("wrong credentials: {e}");
        }
        other => panic!("wrong credentials gave {other:?}"),
    }
    let asked = tokens.requests()[before..].to_vec();
    assert!(
        !asked.is_empty() && asked.iter().all(|r| r.had_credentials && !r.granted),
        "the wrong password was not sent to (and refused by) the token server: {asked:?}"
    );
    assert!(
        asked
            .iter()
            .all(|r| r.scopes == ["repository:private/app:pull"]),
        "a pull asks for pull scope on its repository only: {asked:?}"
    );

    // No credentials at all.
    let before = tokens.requests().len();
    let (anonymous, _) = fetch(&src, &store, &PullOptions::default()).await;
    match &anonymous {
        Err(e @ ImageError::CredentialsNeeded { .. }) => {
            assert!(e.to_string().contains("gave none"), "{e}");
            eprintln!("no credentials: {e}");
        }
        other => panic!("no credentials gave {other:?}"),
    }
    assert!(
        tokens.requests()[before..]
            .iter()
            .all(|r| !r.had_credentials && !r.granted),
        "{:?}",
        tokens.requests()
    );
    assert_eq!(
        std::fs::read_dir(t.path().join("layers/sha256"))
            .unwrap()
            .count(),
        0,
        "a refused pull stored layers"
    );

    // The right credentials: a token, then the manifest and every layer.
    let before = tokens.requests().len();
    let (image, events) = fetch(&src, &store, &with("mayfly", "t0ken-s3cret")).await;
    let image = image.unwrap_or_else(|e| {
        panic!(
            "pull with a token failed: {e:?}; token requests {:?}; registry log:\n{}",
            tokens.requests(),
            registry.log()
        )
    });
    assert_eq!(events.cached(), vec![false; 4]);
    assert_merged(&store, &image);
    assert!(tmp_is_empty(t.path()));
    let granted = tokens.requests()[before..]
        .iter()
        .filter(|r| r.granted)
        .count();
    assert!(
        granted >= 1,
        "pulled without a token: {:?}",
        tokens.requests()
    );
    eprintln!("token pull: {granted} token(s) issued for one pull of 4 layers");
}
