use super::*;
use serde_json::json;

fn names() -> Names {
    Names { tag: "ab12".into() }
}

#[test]
fn slots_get_disjoint_slash30s_and_prefixed_names() {
    let n = names();
    assert_eq!(
        veth_plan(&n, 0),
        VethPlan {
            host_if: "mf-ab12-0".into(),
            host_addr: Ipv4Addr::new(100, 96, 1, 1),
            sandbox_addr: Ipv4Addr::new(100, 96, 1, 2),
            prefix: 30,
        }
    );
    let last = veth_plan(&n, MAX_NET_SLOTS - 1);
    assert_eq!(last.host_if, "mf-ab12-16319");
    assert!(last.host_if.len() <= 15, "IFNAMSIZ");
    assert_eq!(last.sandbox_addr, Ipv4Addr::new(100, 96, 255, 254));
    assert_eq!(slot_of_sandbox(Ipv4Addr::new(100, 96, 1, 6)), Some(1));
    assert_eq!(slot_of_sandbox(Ipv4Addr::new(100, 96, 1, 5)), None);
    assert_eq!(slot_of_sandbox(RESOLVER_ADDR), None);
    assert_eq!(n.slot_of("mf-ab12-17"), Some(17));
    assert_eq!(n.slot_of("mf-cd34-17"), None);
}

#[test]
fn the_tag_is_stable_per_state_directory() {
    let a = Names::for_state_dir(std::path::Path::new("/var/lib/mayfly"));
    assert_eq!(
        a,
        Names::for_state_dir(std::path::Path::new("/var/lib/mayfly"))
    );
    assert_ne!(a, Names::for_state_dir(std::path::Path::new("/tmp/other")));
    assert_eq!(a.tag.len(), 4);
}

#[test]
fn the_ruleset_redirects_dns_and_tcp_and_drops_the_rest() {
    let doc = serde_json::to_value(ruleset(
        &names(),
        Ports {
            proxy: 4000,
            dns: 5000,
        },
    ))
    .unwrap();
    let t = |name: &str| json!({"family": "inet", "table": "mayfly-ab12", "name": name});
    let chain = |name: &str, kind: &str, hook: &str, prio: i32| {
        let mut c = t(name);
        c["type"] = json!(kind);
        c["hook"] = json!(hook);
        c["prio"] = json!(prio);
        c["policy"] = json!("accept");
        json!({"add": {"chain": c}})
    };
    let iif =
        json!({"match": {"left": {"meta": {"key": "iifname"}}, "right": "mf-ab12-*", "op": "=="}});
    let oif =
        json!({"match": {"left": {"meta": {"key": "oifname"}}, "right": "mf-ab12-*", "op": "=="}});
    let dport = |p: &str, n: u16| json!({"match": {"left": {"payload": {"protocol": p, "field": "dport"}}, "right": n, "op": "=="}});
    let dnat = json!({"match": {"left": {"ct": {"key": "status"}}, "right": "dnat", "op": "in"}});
    let rule = |chain: &str, expr: serde_json::Value| json!({"add": {"rule": {"family": "inet", "table": "mayfly-ab12", "chain": chain, "expr": expr}}});
    let table = json!({"table": {"family": "inet", "name": "mayfly-ab12"}});
    let expected = json!({"nftables": [
        {"add": table},
        {"delete": table},
        {"add": table},
        chain("prerouting", "nat", "prerouting", -100),
        chain("input", "filter", "input", 0),
        chain("forward", "filter", "forward", 0),
        chain("output", "filter", "output", 0),
        rule("prerouting", json!([iif, dport("udp", 53), {"redirect": {"port": 5000}}])),
        rule("prerouting", json!([iif, {"match": {"left": {"meta": {"key": "l4proto"}}, "right": "tcp", "op": "=="}}, {"redirect": {"port": 4000}}])),
        rule("input", json!([iif, dport("udp", 5000), dnat, {"accept": null}])),
        rule("input", json!([iif, dport("tcp", 4000), dnat, {"accept": null}])),
        rule("input", json!([iif, {"drop": null}])),
        rule("forward", json!([iif, {"drop": null}])),
        rule("forward", json!([oif, {"drop": null}])),
        rule("output", json!([oif, {"match": {"left": {"ct": {"key": "state"}}, "right": "established", "op": "in"}}, {"accept": null}])),
        rule("output", json!([oif, {"drop": null}])),
    ]});
    assert_eq!(doc, expected);
}

#[test]
fn teardown_removes_only_this_daemons_table() {
    let doc = serde_json::to_value(teardown(&names())).unwrap();
    let table = json!({"table": {"family": "inet", "name": "mayfly-ab12"}});
    assert_eq!(
        doc,
        json!({"nftables": [{"add": table}, {"delete": table}]})
    );
}

#[test]
fn only_other_daemons_tables_without_live_links_are_candidates_for_removal() {
    let ours = names();
    let tables: Vec<String> = [
        "mayfly-ab12", // ours: reconciled as our own
        "mayfly-c047", // no link left: a candidate
        "mayfly-61f6", // a live sandbox's link: kept
        "mayfly-prod", // not a tag of ours: someone else's table
        "mayfly-c0470",
        "other",
    ]
    .map(String::from)
    .to_vec();
    let links = ["mf-61f6-12", "mf-ab12-3", "mf-c04-1"].map(String::from);
    let found: Vec<String> = foreign_tables(&ours, &tables, &links)
        .iter()
        .map(|n| n.table())
        .collect();
    assert_eq!(found, vec!["mayfly-c047".to_owned()]);
    assert_eq!(ours.table_lease(), "table-ab12");
}
