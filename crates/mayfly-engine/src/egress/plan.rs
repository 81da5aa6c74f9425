//! Pure plans of the egress path: the address of each network slot, the
//! names of its kernel objects, and the daemon's nftables ruleset.
//!
//! The ruleset never changes with the sandboxes or their policies: every
//! sandbox interface of this daemon matches one wildcard, and every
//! decision that depends on a policy is made by the daemon's proxy and
//! resolver. So a live policy change is a swap in memory, and a new
//! sandbox costs no nftables transaction.

use std::borrow::Cow;
use std::net::Ipv4Addr;

use mayfly_sys::veth::VethPlan;
use nftables::expr::{Expression, Meta, MetaKey, NamedExpression, Payload, PayloadField, CT};
use nftables::schema::{Chain, NfCmd, NfListObject, NfObject, Nftables, Rule, Table};
use nftables::stmt::{Match, Operator, Statement, NAT};
use nftables::types::{NfChainPolicy, NfChainType, NfFamily, NfHook};

/// Every sandbox address (and the resolver's) lies in this block, which no
/// sandbox may reach: `100.96.0.0/16`, in the shared address space of
/// RFC 6598 that hosts rarely route.
pub const SANDBOX_NET: (Ipv4Addr, u8) = (Ipv4Addr::new(100, 96, 0, 0), 16);
/// The address every sandbox's `/etc/resolv.conf` names. Whatever server a
/// sandbox asks, its DNS lands on the daemon's resolver.
pub const RESOLVER_ADDR: Ipv4Addr = Ipv4Addr::new(100, 96, 0, 53);
/// The first slot's block starts after the first /24, which the resolver's
/// address sits in.
const FIRST_BLOCK: u32 = (100 << 24) | (96 << 16) | (1 << 8);
/// Slots that fit in the block: one /30 each.
pub const MAX_NET_SLOTS: u32 = (1 << 16) / 4 - 64;
const PREFIX: u8 = 30;

/// The name stem of this daemon's objects: `mf-<tag>-` for links and
/// `mayfly-<tag>` for its table. `tag` tells daemons on one host apart.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Names {
    pub tag: String,
}

impl Names {
    /// A tag of four hex digits from the state directory, so a restarted
    /// daemon finds what it left.
    pub fn for_state_dir(state_dir: &std::path::Path) -> Names {
        // FNV-1a: stable across builds, unlike the std hasher.
        let mut h: u32 = 0x811c_9dc5;
        for b in state_dir.as_os_str().as_encoded_bytes() {
            h = (h ^ *b as u32).wrapping_mul(0x0100_0193);
        }
        Names {
            tag: format!("{:04x}", (h ^ (h >> 16)) & 0xffff),
        }
    }

    pub fn link_prefix(&self) -> String {
        format!("mf-{}-", self.tag)
    }

    pub fn link(&self, slot: u32) -> String {
        format!("mf-{}-{slot}", self.tag)
    }

    pub fn table(&self) -> String {
        format!("mayfly-{}", self.tag)
    }

    /// The slot a link of this daemon names.
    pub fn slot_of(&self, link: &str) -> Option<u32> {
        link.strip_prefix(&self.link_prefix())?.parse().ok()
    }

    /// The name of the host-wide lease a live daemon of this tag holds
    /// for its table, in the network lease directory.
    pub fn table_lease(&self) -> String {
        format!("table-{}", self.tag)
    }
}

/// The tables of other daemons that may have died: every `mayfly-<tag>`
/// table in `tables` but this daemon's own and those of a tag that still
/// has a link in `links` (a link whose slot is leased belongs to a live
/// sandbox, and its table must keep guarding it). Whether a candidate's
/// daemon is really gone is its table lease's to say.
pub fn foreign_tables(ours: &Names, tables: &[String], links: &[String]) -> Vec<Names> {
    tables
        .iter()
        .filter_map(|t| t.strip_prefix("mayfly-"))
        .filter(|tag| {
            *tag != ours.tag && tag.len() == 4 && tag.bytes().all(|b| b.is_ascii_hexdigit())
        })
        .map(|tag| Names {
            tag: tag.to_owned(),
        })
        .filter(|n| !links.iter().any(|l| l.starts_with(&n.link_prefix())))
        .collect()
}

/// Both ends of slot `slot`'s /30: the host side is `.1`, the sandbox `.2`.
pub fn veth_plan(names: &Names, slot: u32) -> VethPlan {
    let block = FIRST_BLOCK + slot * 4;
    VethPlan {
        host_if: names.link(slot),
        host_addr: Ipv4Addr::from(block + 1),
        sandbox_addr: Ipv4Addr::from(block + 2),
        prefix: PREFIX,
    }
}

/// The slot whose sandbox side is `addr`.
pub fn slot_of_sandbox(addr: Ipv4Addr) -> Option<u32> {
    let a = u32::from(addr);
    if a < FIRST_BLOCK || a % 4 != 2 {
        return None;
    }
    let slot = (a - FIRST_BLOCK) / 4;
    (slot < MAX_NET_SLOTS).then_some(slot)
}

/// Where the daemon listens for what the rules send it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ports {
    pub proxy: u16,
    pub dns: u16,
}

fn m(left: Expression<'static>, op: Operator, right: Expression<'static>) -> Statement<'static> {
    Statement::Match(Match { left, right, op })
}

fn s(v: &str) -> Expression<'static> {
    Expression::String(Cow::Owned(v.to_owned()))
}

fn meta(key: MetaKey) -> Expression<'static> {
    Expression::Named(NamedExpression::Meta(Meta { key }))
}

fn field(protocol: &'static str, f: &'static str) -> Expression<'static> {
    Expression::Named(NamedExpression::Payload(Payload::PayloadField(
        PayloadField {
            protocol: protocol.into(),
            field: f.into(),
        },
    )))
}

fn ct(key: &'static str) -> Expression<'static> {
    Expression::Named(NamedExpression::CT(CT {
        key: key.into(),
        family: None,
        dir: None,
    }))
}

fn redirect(port: u16) -> Statement<'static> {
    Statement::Redirect(Some(NAT {
        addr: None,
        family: None,
        port: Some(Expression::Number(port as u32)),
        flags: None,
    }))
}

/// The whole ruleset of one daemon, as one transaction: the table is made
/// (if missing), emptied by deleting it, and made again with its chains.
///
/// * **prerouting** (nat): DNS over UDP from a sandbox, to any server, goes
///   to the daemon's resolver; every TCP connection goes to the daemon's
///   transparent proxy, which decides by policy. Nothing is forwarded.
/// * **input**: a sandbox reaches the host only as redirected there: the
///   resolver and the proxy. The host's own services, the daemon's API
///   included, are never reached from a sandbox.
/// * **forward**: nothing from or to a sandbox interface (other sandboxes,
///   the outside: all of it goes through the proxy, as the host).
/// * **output**: the host only answers connections a sandbox opened.
pub fn ruleset(names: &Names, ports: Ports) -> Nftables<'static> {
    let table = names.table();
    let glob = format!("{}*", names.link_prefix());
    let fam = NfFamily::INet;
    let tbl = || Table {
        family: fam,
        name: Cow::Owned(table.clone()),
        handle: None,
    };
    let chain = |name: &'static str, kind: NfChainType, hook: NfHook, prio: i32| Chain {
        family: fam,
        table: Cow::Owned(table.clone()),
        name: name.into(),
        _type: Some(kind),
        hook: Some(hook),
        prio: Some(prio),
        policy: Some(NfChainPolicy::Accept),
        ..Chain::default()
    };
    let rule = |chain: &'static str, expr: Vec<Statement<'static>>| Rule {
        family: fam,
        table: Cow::Owned(table.clone()),
        chain: chain.into(),
        expr: expr.into(),
        ..Rule::default()
    };
    let iif = || m(meta(MetaKey::Iifname), Operator::EQ, s(&glob));
    let oif = || m(meta(MetaKey::Oifname), Operator::EQ, s(&glob));
    let proto = |p: &str| m(meta(MetaKey::L4proto), Operator::EQ, s(p));
    let dport = |p: &'static str, n: u16| {
        m(
            field(p, "dport"),
            Operator::EQ,
            Expression::Number(n as u32),
        )
    };
    let dnat = || m(ct("status"), Operator::IN, s("dnat"));
    let drop = || Statement::Drop(None);
    let accept = || Statement::Accept(None);
    let add = |o: NfListObject<'static>| NfObject::CmdObject(NfCmd::Add(o));
    let objects = vec![
        add(NfListObject::Table(tbl())),
        NfObject::CmdObject(NfCmd::Delete(NfListObject::Table(tbl()))),
        add(NfListObject::Table(tbl())),
        add(NfListObject::Chain(chain(
            "prerouting",
            NfChainType::NAT,
            NfHook::Prerouting,
            -100,
        ))),
        add(NfListObject::Chain(chain(
            "input",
            NfChainType::Filter,
            NfHook::Input,
            0,
        ))),
        add(NfListObject::Chain(chain(
            "forward",
            NfChainType::Filter,
            NfHook::Forward,
            0,
        ))),
        add(NfListObject::Chain(chain(
            "output",
            NfChainType::Filter,
            NfHook::Output,
            0,
        ))),
        add(NfListObject::Rule(rule(
            "prerouting",
            vec![iif(), dport("udp", 53), redirect(ports.dns)],
        ))),
        add(NfListObject::Rule(rule(
            "prerouting",
            vec![iif(), proto("tcp"), redirect(ports.proxy)],
        ))),
        add(NfListObject::Rule(rule(
            "input",
            vec![iif(), dport("udp", ports.dns), dnat(), accept()],
        ))),
        add(NfListObject::Rule(rule(
            "input",
            vec![iif(), dport("tcp", ports.proxy), dnat(), accept()],
        ))),
        add(NfListObject::Rule(rule("input", vec![iif(), drop()]))),
        add(NfListObject::Rule(rule("forward", vec![iif(), drop()]))),
        add(NfListObject::Rule(rule("forward", vec![oif(), drop()]))),
        add(NfListObject::Rule(rule(
            "output",
            vec![
                oif(),
                m(ct("state"), Operator::IN, s("established")),
                accept(),
            ],
        ))),
        add(NfListObject::Rule(rule("output", vec![oif(), drop()]))),
    ];
    Nftables {
        objects: objects.into(),
    }
}

/// The document that removes this daemon's table.
pub fn teardown(names: &Names) -> Nftables<'static> {
    let tbl = || Table {
        family: NfFamily::INet,
        name: Cow::Owned(names.table()),
        handle: None,
    };
    Nftables {
        objects: vec![
            NfObject::CmdObject(NfCmd::Add(NfListObject::Table(tbl()))),
            NfObject::CmdObject(NfCmd::Delete(NfListObject::Table(tbl()))),
        ]
        .into(),
    }
}

#[cfg(test)]
#[path = "plan_tests.rs"]
mod tests;
