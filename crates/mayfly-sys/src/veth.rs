//! Network namespaces wired to the host by a veth pair, over rtnetlink.
//!
//! A sandbox with egress gets a namespace made here ahead of time: `lo` up,
//! `eth0` with the sandbox's address and a default route to the host side
//! of the pair, IPv6 off inside (no link-local route around the rules).
//! The namespace is kept alive by the returned descriptor only; a sandbox's
//! stub joins it with [`join_net`].
//!
//! Every call runs on a short-lived thread of its own with a current-thread
//! runtime: the thread is the one that moves into the new namespace (network
//! namespaces are per thread, so the daemon's other threads stay where they
//! are), and the calls work whether or not the caller is inside a runtime.

use std::net::{IpAddr, Ipv4Addr};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};

use futures_util::TryStreamExt;
use rtnetlink::packet_route::link::{InfoData, InfoKind, InfoVeth, LinkAttribute};
use rtnetlink::{Handle, LinkMessageBuilder, LinkUnspec, RouteMessageBuilder};

/// What one prepared namespace looks like from both ends.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VethPlan {
    /// The host side's name (`mf-…`, at most 15 bytes).
    pub host_if: String,
    pub host_addr: Ipv4Addr,
    pub sandbox_addr: Ipv4Addr,
    pub prefix: u8,
}

/// A veth or namespace operation that failed.
#[derive(Debug, thiserror::Error)]
pub enum VethError {
    #[error("{op} for {link}")]
    Io {
        op: &'static str,
        link: String,
        #[source]
        source: std::io::Error,
    },
    #[error("netlink {op} for {link}: {message}")]
    Netlink {
        op: &'static str,
        link: String,
        message: String,
    },
    #[error("the network setup thread for {0} died")]
    Thread(String),
}

fn io<'a>(op: &'static str, link: &'a str) -> impl FnOnce(std::io::Error) -> VethError + 'a {
    move |source| VethError::Io {
        op,
        link: link.to_owned(),
        source,
    }
}

fn nl<'a>(op: &'static str, link: &'a str) -> impl FnOnce(rtnetlink::Error) -> VethError + 'a {
    move |e| VethError::Netlink {
        op,
        link: link.to_owned(),
        message: e.to_string(),
    }
}

/// Runs `f` on a fresh thread with a current-thread runtime.
fn on_own_thread<T: Send + 'static>(
    what: String,
    f: impl FnOnce() -> Result<T, VethError> + Send + 'static,
) -> Result<T, VethError> {
    std::thread::Builder::new()
        .name("mayfly-net".into())
        .spawn(f)
        .map_err(io("spawning the network thread", &what))?
        .join()
        .map_err(|_| VethError::Thread(what))?
}

fn runtime(link: &str) -> Result<tokio::runtime::Runtime, VethError> {
    tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .build()
        .map_err(io("building a runtime", link))
}

/// A netlink connection in the calling thread's network namespace.
fn connect(link: &str) -> Result<(Handle, impl std::future::Future<Output = ()>), VethError> {
    let (conn, handle, _) = rtnetlink::new_connection().map_err(io("opening netlink", link))?;
    Ok((handle, conn))
}

async fn index_of(h: &Handle, name: &str) -> Result<Option<u32>, VethError> {
    let mut links = h.link().get().match_name(name.to_owned()).execute();
    match links.try_next().await {
        Ok(Some(m)) => Ok(Some(m.header.index)),
        Ok(None) => Ok(None),
        Err(rtnetlink::Error::NetlinkError(e)) if e.raw_code() == -libc::ENODEV => Ok(None),
        Err(e) => Err(nl("looking up", name)(e)),
    }
}

fn open_thread_netns(link: &str) -> Result<OwnedFd, VethError> {
    std::fs::File::open("/proc/thread-self/ns/net")
        .map(OwnedFd::from)
        .map_err(io("opening the network namespace", link))
}

/// Makes a network namespace wired to the host as `plan` says, and returns
/// the descriptor that keeps it alive.
pub fn make_netns_with_veth(plan: &VethPlan) -> Result<OwnedFd, VethError> {
    let plan = plan.clone();
    on_own_thread(plan.host_if.clone(), move || {
        let link = plan.host_if.as_str();
        let rt = runtime(link)?;
        let _guard = rt.enter();
        let (host, host_conn) = connect(link)?;
        rt.spawn(host_conn);
        let host_ns = open_thread_netns(link)?;
        nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNET)
            .map_err(|e| io("unshare(CLONE_NEWNET)", link)(e.into()))?;
        crate::net::loopback_up().map_err(|e| io("bringing lo up", link)(e.source))?;
        // No IPv6 inside: the sandbox gets no link-local address to reach the
        // host side with, and every rule and check is IPv4.
        std::fs::write("/proc/sys/net/ipv6/conf/default/disable_ipv6", "1")
            .map_err(io("turning IPv6 off", link))?;
        let ns = open_thread_netns(link)?;
        let (inside, ns_conn) = connect(link)?;
        rt.spawn(ns_conn);
        rt.block_on(wire(&plan, &host, &inside, host_ns.as_fd()))?;
        Ok(ns)
    })
}

/// Creates the pair from inside (`eth0` here, the host side moved out), then
/// addresses both ends and routes the sandbox's traffic to the host side.
async fn wire(
    plan: &VethPlan,
    host: &Handle,
    inside: &Handle,
    host_ns: BorrowedFd<'_>,
) -> Result<(), VethError> {
    let link = plan.host_if.as_str();
    let peer = LinkMessageBuilder::<LinkUnspec>::new()
        .name(plan.host_if.clone())
        .setns_by_fd(host_ns.as_raw_fd())
        .build();
    let veth = LinkMessageBuilder::<LinkUnspec>::new_with_info_kind(InfoKind::Veth)
        .name("eth0".to_owned())
        .set_info_data(InfoData::Veth(InfoVeth::Peer(peer)))
        .build();
    inside
        .link()
        .add(veth)
        .execute()
        .await
        .map_err(nl("creating the veth pair", link))?;
    let eth0 = index_of(inside, "eth0")
        .await?
        .ok_or_else(|| io("finding eth0", link)(std::io::ErrorKind::NotFound.into()))?;
    inside
        .address()
        .add(eth0, IpAddr::V4(plan.sandbox_addr), plan.prefix)
        .execute()
        .await
        .map_err(nl("addressing eth0", link))?;
    inside
        .link()
        .set(
            LinkMessageBuilder::<LinkUnspec>::new()
                .index(eth0)
                .up()
                .build(),
        )
        .execute()
        .await
        .map_err(nl("bringing eth0 up", link))?;
    inside
        .route()
        .add(
            RouteMessageBuilder::<Ipv4Addr>::new()
                .gateway(plan.host_addr)
                .output_interface(eth0)
                .build(),
        )
        .execute()
        .await
        .map_err(nl("adding the default route", link))?;
    let outside = index_of(host, link)
        .await?
        .ok_or_else(|| io("finding the host side", link)(std::io::ErrorKind::NotFound.into()))?;
    host.address()
        .add(outside, IpAddr::V4(plan.host_addr), plan.prefix)
        .execute()
        .await
        .map_err(nl("addressing the host side", link))?;
    host.link()
        .set(
            LinkMessageBuilder::<LinkUnspec>::new()
                .index(outside)
                .up()
                .build(),
        )
        .execute()
        .await
        .map_err(nl("bringing the host side up", link))?;
    Ok(())
}

/// Deletes the host-side link `name` (its peer goes with it). A link that
/// is already gone is not an error.
pub fn delete_link(name: &str) -> Result<(), VethError> {
    let name = name.to_owned();
    on_own_thread(name.clone(), move || {
        let rt = runtime(&name)?;
        let _guard = rt.enter();
        let (h, conn) = connect(&name)?;
        rt.spawn(conn);
        rt.block_on(async {
            let Some(index) = index_of(&h, &name).await? else {
                return Ok(());
            };
            match h.link().del(index).execute().await {
                Err(rtnetlink::Error::NetlinkError(e)) if e.raw_code() == -libc::ENODEV => Ok(()),
                r => r.map_err(nl("deleting", &name)),
            }
        })
    })
}

/// The names of the host's links that start with `prefix`.
pub fn list_links(prefix: &str) -> Result<Vec<String>, VethError> {
    let prefix = prefix.to_owned();
    on_own_thread(prefix.clone(), move || {
        let rt = runtime(&prefix)?;
        let _guard = rt.enter();
        let (h, conn) = connect(&prefix)?;
        rt.spawn(conn);
        rt.block_on(async {
            let mut names = Vec::new();
            let mut links = h.link().get().execute();
            while let Some(m) = links
                .try_next()
                .await
                .map_err(nl("listing links", &prefix))?
            {
                for a in m.attributes {
                    if let LinkAttribute::IfName(n) = a {
                        if n.starts_with(prefix.as_str()) {
                            names.push(n);
                        }
                    }
                }
            }
            Ok(names)
        })
    })
}

/// Moves the calling (single-threaded) process into the network namespace
/// `ns`. The namespace it leaves ends when nothing else holds it.
pub fn join_net(ns: BorrowedFd<'_>) -> Result<(), VethError> {
    nix::sched::setns(ns, nix::sched::CloneFlags::CLONE_NEWNET)
        .map_err(|e| io("setns(CLONE_NEWNET)", "the sandbox")(e.into()))
}

/// Every address configured on the host's interfaces (in the caller's
/// network namespace). An error when they cannot be read: an empty list
/// would say "the host has no address", which the egress proxy must never
/// be told by mistake.
pub fn host_addresses() -> Result<Vec<IpAddr>, VethError> {
    let addrs = nix::ifaddrs::getifaddrs()
        .map_err(|e| io("getifaddrs", "the host's interfaces")(e.into()))?;
    Ok(addrs
        .filter_map(|a| a.address)
        .filter_map(|s| {
            if let Some(v4) = s.as_sockaddr_in() {
                Some(IpAddr::V4(v4.ip()))
            } else {
                s.as_sockaddr_in6().map(|v6| IpAddr::V6(v6.ip()))
            }
        })
        .collect())
}

/// The destination a redirected TCP connection was sent to
/// (`SO_ORIGINAL_DST`), from the kernel's connection tracking.
pub fn original_dst(sock: BorrowedFd<'_>) -> std::io::Result<std::net::SocketAddrV4> {
    let sin = nix::sys::socket::getsockopt(&sock, nix::sys::socket::sockopt::OriginalDst)?;
    Ok(std::net::SocketAddrV4::new(
        Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr)),
        u16::from_be(sin.sin_port),
    ))
}
