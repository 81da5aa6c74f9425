use super::*;

fn policy(mode: EgressMode, allow: &[&str], deny: &[&str]) -> EgressPolicy {
    EgressPolicy {
        mode,
        allow: allow.iter().map(|s| s.parse().unwrap()).collect(),
        deny: deny.iter().map(|s| s.parse().unwrap()).collect(),
        ..EgressPolicy::default()
    }
}

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

const HOST: [IpAddr; 2] = [
    IpAddr::V4(Ipv4Addr::new(10, 0, 0, 5)),
    IpAddr::V4(Ipv4Addr::new(100, 96, 1, 1)),
];

fn names(n: &[&str]) -> Vec<String> {
    n.iter().map(|s| s.to_string()).collect()
}

#[test]
fn the_always_blocked_set_beats_any_policy() {
    let open = policy(EgressMode::Open, &[], &[]);
    let all = policy(EgressMode::Allow, &["0.0.0.0/0", "[::/0]"], &[]);
    for (addr, port) in [
        ("127.0.0.1", 8080),
        ("10.0.0.5", 7777),
        ("100.96.1.6", 80),
        ("169.254.169.254", 80),
        ("fd00:ec2::254", 80),
        ("fe80::1", 22),
        ("::1", 1),
        ("::ffff:127.0.0.1", 80),
        ("8.8.8.8", 53),
        ("1.1.1.1", 853),
        ("198.51.100.7", 853),
        ("224.0.0.1", 5353),
    ] {
        for p in [&open, &all] {
            assert_eq!(
                decide(p, ip(addr), port, &[], &HOST),
                Verdict::Refuse(Refusal::AlwaysBlocked),
                "{addr}:{port}"
            );
        }
    }
}

#[test]
fn allow_mode_admits_cidrs_and_resolved_names_only() {
    let p = policy(
        EgressMode::Allow,
        &["192.0.2.0/24:8000-8099", "api.example.com", "*.pkg.dev:443"],
        &[],
    );
    assert_eq!(
        decide(&p, ip("192.0.2.7"), 8000, &[], &HOST),
        Verdict::Allow
    );
    assert_eq!(
        decide(&p, ip("192.0.2.7"), 8100, &[], &HOST),
        Verdict::Refuse(Refusal::NotAllowed)
    );
    assert_eq!(
        decide(&p, ip("198.51.100.1"), 80, &[], &HOST),
        Verdict::Refuse(Refusal::NotAllowed)
    );
    let api = names(&["api.example.com"]);
    assert_eq!(
        decide(&p, ip("198.51.100.1"), 5432, &api, &HOST),
        Verdict::Allow
    );
    assert_eq!(
        decide(&p, ip("198.51.100.1"), 443, &api, &HOST),
        Verdict::CheckName
    );
    let pkg = names(&["eu.pkg.dev"]);
    assert_eq!(
        decide(&p, ip("198.51.100.2"), 443, &pkg, &HOST),
        Verdict::CheckName
    );
    assert_eq!(
        decide(&p, ip("198.51.100.2"), 80, &pkg, &HOST),
        Verdict::Refuse(Refusal::NotAllowed)
    );
}

#[test]
fn presented_names_must_be_allowed_for_the_port() {
    let p = policy(
        EgressMode::Allow,
        &["api.example.com", "*.pkg.dev:443"],
        &["secret.pkg.dev"],
    );
    assert!(name_fits(&p, "api.example.com", 443));
    assert!(name_fits(&p, "API.example.com.", 80));
    assert!(!name_fits(&p, "evil.example.com", 443));
    assert!(name_fits(&p, "eu.pkg.dev", 443));
    assert!(!name_fits(&p, "eu.pkg.dev", 80));
    assert!(!name_fits(&p, "secret.pkg.dev", 443));
}

#[test]
fn deny_entries_win_over_allow_and_open() {
    let p = policy(
        EgressMode::Open,
        &[],
        &["192.0.2.0/24", "blocked.example.com"],
    );
    assert_eq!(
        decide(&p, ip("192.0.2.9"), 443, &[], &HOST),
        Verdict::Refuse(Refusal::Denied)
    );
    assert_eq!(
        decide(&p, ip("198.51.100.9"), 443, &[], &HOST),
        Verdict::Allow
    );
    let blocked = names(&["blocked.example.com"]);
    assert_eq!(
        decide(&p, ip("198.51.100.9"), 443, &blocked, &HOST),
        Verdict::Refuse(Refusal::Denied)
    );
    assert!(!may_resolve(&p, "blocked.example.com"));
    assert!(may_resolve(&p, "anything.example.org"));
}

#[test]
fn the_resolver_answers_allowed_names_only() {
    let p = policy(
        EgressMode::Allow,
        &["api.example.com:443", "*.pkg.dev"],
        &[],
    );
    assert!(may_resolve(&p, "api.example.com"));
    assert!(may_resolve(&p, "x.pkg.dev"));
    assert!(!may_resolve(&p, "pkg.dev"));
    assert!(!may_resolve(&p, "example.com"));
    assert!(!may_resolve(
        &policy(EgressMode::None, &["api.example.com"], &[]),
        "api.example.com"
    ));
}

#[test]
fn mode_none_refuses_everything() {
    let p = policy(EgressMode::None, &["0.0.0.0/0"], &[]);
    assert_eq!(
        decide(&p, ip("192.0.2.1"), 443, &[], &HOST),
        Verdict::Refuse(Refusal::NotAllowed)
    );
}
