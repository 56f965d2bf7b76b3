//! A real, silent network partition (DESIGN G9 and the threat model): a network namespace
//! joined to this host by a veth pair, a test-kit PostgreSQL cluster listening on the host's end
//! of it, and replica processes inside the namespace (`ip netns exec`). [`Link::cut`] drops
//! every packet on the namespace's end of the link with nftables (ingress and egress hooks of
//! its interface): no RST, no FIN, no ICMP; the peers' kernels just retransmit into the void,
//! and with permanent neighbour entries not even ARP fails. [`Link::heal`] removes the rules.
//!
//! Each link takes a /30 of 10.200.0.0/16 (host `.1`, namespace `.2` of its block), claimed
//! atomically by creating the host-side interface `pgt<block>h`, so concurrently running tests
//! (in one process or several) never share an address. Dropping a [`Link`] deletes the
//! interfaces and the namespace, also while a panic unwinds; what a killed test process left
//! behind (its pid in the interface's alias and the namespace's name) is removed by the next
//! process that makes a link.
//!
//! Needs root, `ip` (iproute2) and `nft` (nftables). Where the machine cannot make a namespace,
//! [`skip`] prints one line saying what to install and the test returns; with
//! `PGTENANT_REQUIRE_NETNS=1` (`.ci/run` sets it) that is a failure instead.

use std::io::Write;
use std::net::{IpAddr, Ipv4Addr};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Once;
use std::time::{Duration, Instant};

use pgtenant_testkit::{LocalCluster, TestDatabase};

use super::{History, ReplicaProcess};

/// Set to `1` to make a test that cannot make a namespace fail instead of skipping.
pub(crate) const REQUIRE_ENV: &str = "PGTENANT_REQUIRE_NETNS";

const INSTALL: &str = "run the tests as root on Linux with iproute2 and nftables \
                       (apt-get install iproute2 nftables)";

/// How many /30 blocks 10.200.0.0/16 holds.
const BLOCKS: u32 = 1 << 14;

/// The nftables table that cuts a link, inside its namespace.
const CUT_TABLE: &str = "pgtenant_cut";

/// Whether this machine can make links, or why not. Checked once per process: root, then `ip`
/// and `nft` that run, then a namespace actually made and removed.
fn availability() -> &'static Result<(), String> {
    static CHECKED: std::sync::OnceLock<Result<(), String>> = std::sync::OnceLock::new();
    CHECKED.get_or_init(|| {
        // "Uid: real effective saved fs"
        let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
        let effective = status
            .lines()
            .find_map(|line| line.strip_prefix("Uid:"))
            .and_then(|ids| ids.split_whitespace().nth(1));
        if effective != Some("0") {
            return Err("not root".to_owned());
        }
        for (program, args) in [("ip", &["-V"][..]), ("nft", &["--version"][..])] {
            match Command::new(program).args(args).output() {
                Ok(output) if output.status.success() => {}
                Ok(output) => {
                    return Err(format!(
                        "`{program} {}` failed: {}",
                        args.join(" "),
                        String::from_utf8_lossy(&output.stderr).trim()
                    ))
                }
                Err(error) => return Err(format!("no `{program}` command ({error})")),
            }
        }
        let probe = format!("pgtenant-probe-{}", std::process::id());
        run(&["ip", "netns", "add", &probe], None)
            .map_err(|error| format!("cannot make a network namespace: {error}"))?;
        let _ = run(&["ip", "netns", "del", &probe], None);
        Ok(())
    })
}

/// Whether the calling test should skip: true (after one line on stderr naming the test and
/// what to install) when this machine cannot make namespaces; panics instead under
/// `PGTENANT_REQUIRE_NETNS=1`.
pub(crate) fn skip(test: &str) -> bool {
    let Err(why) = availability() else {
        return false;
    };
    let required = std::env::var(REQUIRE_ENV).is_ok_and(|value| value == "1");
    assert!(
        !required,
        "{test}: no network namespace ({why}) and {REQUIRE_ENV}=1: {INSTALL}"
    );
    // On stderr directly (the harness captures eprintln! of passing tests), in one write:
    // tests running at once would interleave the pieces of a formatted one.
    let line = format!("{test}: skipped, no network namespace here ({why}): {INSTALL}\n");
    let _ = std::io::stderr().lock().write_all(line.as_bytes());
    true
}

/// Runs a command (with `stdin` fed to it), returning its stdout or what it said on failure.
fn run(args: &[&str], stdin: Option<&str>) -> Result<String, String> {
    let mut child = Command::new(args[0])
        .args(&args[1..])
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|error| format!("{}: {error}", args.join(" ")))?;
    if let (Some(text), Some(mut pipe)) = (stdin, child.stdin.take()) {
        let _ = pipe.write_all(text.as_bytes());
    }
    let output = child
        .wait_with_output()
        .map_err(|error| format!("{}: {error}", args.join(" ")))?;
    if output.status.success() {
        Ok(String::from_utf8_lossy(&output.stdout).into_owned())
    } else {
        Err(format!(
            "{} ({}): {}",
            args.join(" "),
            output.status,
            String::from_utf8_lossy(&output.stderr).trim()
        ))
    }
}

fn alive(pid: u32) -> bool {
    std::path::Path::new(&format!("/proc/{pid}")).exists()
}

/// Removes the links and namespaces of test processes that died without dropping theirs.
fn sweep_leftovers() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let links = run(&["ip", "-o", "link", "show"], None).unwrap_or_default();
        for line in links.lines() {
            // "7: pgt12h@if2: <…> … alias pgtenant-pid-1234"
            let Some(name) = line
                .split(": ")
                .nth(1)
                .map(|n| n.split('@').next().unwrap_or(n))
            else {
                continue;
            };
            let owner = line
                .split("alias pgtenant-pid-")
                .nth(1)
                .and_then(|rest| rest.split_whitespace().next())
                .and_then(|pid| pid.parse::<u32>().ok());
            if name.starts_with("pgt") && owner.is_some_and(|pid| !alive(pid)) {
                let _ = run(&["ip", "link", "del", name], None);
            }
        }
        let namespaces = run(&["ip", "netns", "list"], None).unwrap_or_default();
        for name in namespaces
            .lines()
            .filter_map(|l| l.split_whitespace().next())
        {
            let owner = name
                .strip_prefix("pgtenant-")
                .and_then(|rest| rest.rsplit('-').next())
                .and_then(|pid| pid.parse::<u32>().ok());
            if owner.is_some_and(|pid| !alive(pid)) {
                let _ = run(&["ip", "netns", "del", name], None);
            }
        }
    });
}

/// The MAC address of interface `name` (in `namespace`, else on the host).
fn mac(namespace: Option<&str>, name: &str) -> Result<String, String> {
    let mut args = vec!["ip"];
    if let Some(namespace) = namespace {
        args.extend(["-n", namespace]);
    }
    args.extend(["-o", "link", "show", name]);
    let line = run(&args, None)?;
    line.split("link/ether ")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .map(str::to_owned)
        .ok_or_else(|| format!("no MAC address for {name} in {line:?}"))
}

/// A network namespace joined to this host by a veth pair: `host` on this side, `inside` in
/// the namespace, a /30 of their own.
pub(crate) struct Link {
    /// The namespace's name, for `ip netns exec`.
    pub(crate) namespace: String,
    /// The host's address on the link: where a cluster listens for the namespace's processes.
    pub(crate) host: Ipv4Addr,
    /// The namespace's address.
    pub(crate) inside: Ipv4Addr,
    host_if: String,
    inside_if: String,
    cut: AtomicBool,
}

impl Link {
    /// A new namespace and its link, up and answering. Panics with the command's words when
    /// the machine refuses (call [`skip`] first).
    pub(crate) fn new() -> Link {
        sweep_leftovers();
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let pid = std::process::id();
        // Spread processes over the blocks; within one, take the next free block.
        let start = pid.wrapping_mul(2_654_435_761) % BLOCKS;
        for _ in 0..BLOCKS {
            let block = (start + NEXT.fetch_add(1, Ordering::Relaxed)) % BLOCKS;
            let host_if = format!("pgt{block}h");
            let inside_if = format!("pgt{block}n");
            // The claim: creating the interface fails when another test holds this block.
            if run(
                &[
                    "ip", "link", "add", &host_if, "type", "veth", "peer", "name", &inside_if,
                ],
                None,
            )
            .is_err()
            {
                continue;
            }
            let base = u32::from(Ipv4Addr::new(10, 200, 0, 0)) + block * 4;
            let (host, inside) = (Ipv4Addr::from(base + 1), Ipv4Addr::from(base + 2));
            let link = Link {
                namespace: format!("pgtenant-{block}-{pid}"),
                host,
                inside,
                host_if,
                inside_if,
                cut: AtomicBool::new(false),
            };
            // From here on, dropping `link` removes whatever was made.
            let taken = run(
                &[
                    "ip",
                    "-4",
                    "-o",
                    "addr",
                    "show",
                    "to",
                    &format!("{host}/30"),
                ],
                None,
            )
            .unwrap_or_default();
            if !taken.trim().is_empty() {
                continue; // someone else uses these addresses: the next block
            }
            if let Err(error) = link.configure(pid) {
                panic!("making a network namespace: {error}");
            }
            return link;
        }
        panic!("no free /30 block in 10.200.0.0/16 for a test link");
    }

    fn configure(&self, pid: u32) -> Result<(), String> {
        let (ns, host_if, inside_if) = (&self.namespace, &self.host_if, &self.inside_if);
        let (host, inside) = (format!("{}/30", self.host), format!("{}/30", self.inside));
        let alias = format!("pgtenant-pid-{pid}");
        run(&["ip", "link", "set", host_if, "alias", &alias], None)?;
        run(&["ip", "netns", "add", ns], None)?;
        run(&["ip", "link", "set", inside_if, "netns", ns], None)?;
        run(&["ip", "addr", "add", &host, "dev", host_if], None)?;
        run(&["ip", "link", "set", host_if, "up"], None)?;
        run(
            &["ip", "-n", ns, "addr", "add", &inside, "dev", inside_if],
            None,
        )?;
        run(&["ip", "-n", ns, "link", "set", inside_if, "up"], None)?;
        run(&["ip", "-n", ns, "link", "set", "lo", "up"], None)?;
        // Permanent neighbours: during a cut no ARP fails, so no kernel reports the peer
        // unreachable (a local ICMP error); the packets simply vanish.
        let host_mac = mac(None, host_if)?;
        let inside_mac = mac(Some(ns), inside_if)?;
        let inside_ip = self.inside.to_string();
        let host_ip = self.host.to_string();
        run(
            &[
                "ip",
                "neigh",
                "replace",
                &inside_ip,
                "lladdr",
                &inside_mac,
                "dev",
                host_if,
                "nud",
                "permanent",
            ],
            None,
        )?;
        run(
            &[
                "ip",
                "-n",
                ns,
                "neigh",
                "replace",
                &host_ip,
                "lladdr",
                &host_mac,
                "dev",
                inside_if,
                "nud",
                "permanent",
            ],
            None,
        )?;
        Ok(())
    }

    /// Cuts the link silently: every packet in either direction is dropped on the namespace's
    /// interface (nftables, ingress and egress). Idempotent.
    pub(crate) fn cut(&self) {
        if self.cut.swap(true, Ordering::SeqCst) {
            return;
        }
        let rules = format!(
            "table netdev {CUT_TABLE} {{
               chain inbound {{ type filter hook ingress device \"{dev}\" priority -500; policy drop; }}
               chain outbound {{ type filter hook egress device \"{dev}\" priority -500; policy drop; }}
             }}",
            dev = self.inside_if
        );
        run(
            &["ip", "netns", "exec", &self.namespace, "nft", "-f", "-"],
            Some(&rules),
        )
        .expect("cut the link");
    }

    /// Removes the cut's rules. Idempotent.
    pub(crate) fn heal(&self) {
        if !self.cut.swap(false, Ordering::SeqCst) {
            return;
        }
        run(
            &[
                "ip",
                "netns",
                "exec",
                &self.namespace,
                "nft",
                "delete",
                "table",
                "netdev",
                CUT_TABLE,
            ],
            None,
        )
        .expect("heal the link");
    }

    pub(crate) fn is_cut(&self) -> bool {
        self.cut.load(Ordering::SeqCst)
    }

    /// The host's address, as the test kit takes it.
    pub(crate) fn host_ip(&self) -> IpAddr {
        IpAddr::V4(self.host)
    }

    /// A replica process inside this namespace, connecting to `url` (one through
    /// [`Link::host`]).
    pub(crate) fn spawn(&self, entry: &str, url: &str, replica: &str) -> ReplicaProcess {
        ReplicaProcess::spawn_in(entry, url, replica, Some(&self.namespace), &[])
    }
}

impl Drop for Link {
    fn drop(&mut self) {
        // Deleting one end of a veth pair deletes both; the namespace goes when its last
        // process has (a replica still running inside keeps it until it exits).
        let _ = run(&["ip", "link", "del", &self.host_if], None);
        let _ = run(&["ip", "netns", "del", &self.namespace], None);
    }
}

/// A throwaway cluster listening on 127.0.0.1 and on the host end of every link, with a
/// database and the control plane on it.
pub(crate) async fn cluster_on(links: &[&Link]) -> (LocalCluster, TestDatabase) {
    let cluster = links
        .iter()
        .fold(LocalCluster::builder(), |builder, link| {
            builder.listen_on(link.host_ip(), 30)
        })
        .start()
        .await
        .expect("a cluster listening on the links");
    let db = cluster.create_database().await.expect("database");
    let mut client = db.connect().await.expect("connect");
    pgtenant::setup(&mut client).await.expect("setup");
    (cluster, db)
}

/// The history driver's partition fault ([`super::Faults::partitions`]): each replica of a run
/// lives in a namespace of its own and reaches the cluster through its link.
pub(crate) struct Partitions {
    links: Vec<Link>,
    urls: Vec<String>,
    /// The database through 127.0.0.1, for looking at leases.
    admin_url: String,
}

/// One cut of a history run: which replica, when, and for how long.
#[derive(Debug, Clone)]
pub(crate) struct Cut {
    pub(crate) replica: String,
    pub(crate) at: Instant,
    pub(crate) healed: Option<Instant>,
    /// A shared ledger the replica held at the cut, which another replica takes over during
    /// it.
    pub(crate) ledger: Option<String>,
    /// Whether a transaction was open (a `hold`) across the cut.
    pub(crate) in_flight: bool,
    /// From the cut to another replica's first acknowledged write to `ledger`.
    pub(crate) taken_over: Option<Duration>,
}

impl Partitions {
    /// `replicas` links and a cluster listening on all of them: the run's URL (for the
    /// driver's own sessions and the checker) is the returned database's, through 127.0.0.1.
    pub(crate) async fn start(replicas: usize) -> (Partitions, LocalCluster, TestDatabase) {
        let links: Vec<Link> = (0..replicas).map(|_| Link::new()).collect();
        let (cluster, db) = cluster_on(&links.iter().collect::<Vec<_>>()).await;
        let urls = links
            .iter()
            .map(|link| cluster.url_on(link.host_ip(), db.name()))
            .collect();
        let admin_url = db.url().to_owned();
        (
            Partitions {
                links,
                urls,
                admin_url,
            },
            cluster,
            db,
        )
    }

    /// Replica number `c` (named `name`), in its namespace.
    pub(crate) fn spawn(&self, entry: &str, c: usize, name: &str) -> ReplicaProcess {
        self.links[c].spawn(entry, &self.urls[c], name)
    }
}

/// What the driver does with a replica's turn while partitions are on.
pub(crate) enum Turn {
    /// Its link is cut, its answer to the work in flight across the cut is still out, or the
    /// turn went to taking over a cut replica's ledger.
    Skip,
    /// The replica's partition just ended (healed, and its in-flight work answered).
    Ended,
    /// Nothing to do with partitions.
    Go,
}

/// The writes of directed takeovers and forced cuts use their own sequence numbers, apart
/// from the driver's.
const TAKEOVER_SEQ: i64 = 1_000_000_000;

/// The longest the fault phase goes without a cut.
const FORCED_CUT_EVERY: Duration = Duration::from_secs(3);

/// The partition fault's state during one history run.
pub(crate) struct PartitionFaults<'a> {
    partitions: &'a Partitions,
    shared: Vec<String>,
    /// Per replica: until when its link stays cut.
    cut_until: Vec<Option<Instant>>,
    /// Per replica: the work open across its cut (ledger, seq), whose answer is still out.
    pending: Vec<Option<(String, i64)>>,
    /// Per replica: the index in `History::cuts` of its current cut.
    current: Vec<Option<usize>>,
    /// Cuts (indices in `History::cuts`) whose ledger no other replica has written yet.
    takeovers_due: Vec<usize>,
    takeover_seq: i64,
    /// When the last cut began (the run's start before the first).
    last_cut: Instant,
    /// For the forced cuts' durations.
    rng: u64,
}

impl<'a> PartitionFaults<'a> {
    pub(crate) fn new(partitions: &'a Partitions, shared: &[&str]) -> PartitionFaults<'a> {
        let n = partitions.links.len();
        PartitionFaults {
            partitions,
            shared: shared.iter().map(|ledger| (*ledger).to_owned()).collect(),
            cut_until: vec![None; n],
            pending: vec![None; n],
            current: vec![None; n],
            takeovers_due: Vec::new(),
            takeover_seq: TAKEOVER_SEQ,
            last_cut: Instant::now(),
            rng: 0x2545_f491_4f6c_dd1d,
        }
    }

    /// The shared ledgers `replica` holds by the database's account (`lease_status`).
    async fn held_by(&self, replica: &str) -> Vec<String> {
        let Ok((client, connection)) =
            tokio_postgres::connect(&self.partitions.admin_url, tokio_postgres::NoTls).await
        else {
            return Vec::new();
        };
        tokio::spawn(connection);
        let keys: Vec<String> = self
            .shared
            .iter()
            .map(|ledger| super::tenant(ledger).to_string())
            .collect();
        client
            .query(
                "SELECT tenant FROM pgtenant.lease_status
                  WHERE owner = $1 AND state = 'held' AND tenant = ANY($2) ORDER BY tenant",
                &[&replica, &keys],
            )
            .await
            .map(|rows| {
                rows.iter()
                    .filter_map(|row| {
                        let key: String = row.get(0);
                        key.split_once('/').map(|(_, ledger)| ledger.to_owned())
                    })
                    .collect()
            })
            .unwrap_or_default()
    }

    /// What replica `c`'s turn is for. A cut link heals once its time is up (or the fault
    /// phase is over); a replica with work open across its cut takes no turn until that work
    /// has answered (an acknowledged answer counts as an acknowledged write); and while a cut
    /// replica's shared ledger waits for a takeover, until it is taken or the link heals, the
    /// turns of the others go to it: open it (refused while the cut replica's lease lasts) and
    /// write it.
    pub(crate) async fn turn(
        &mut self,
        c: usize,
        child: &mut ReplicaProcess,
        history: &mut History,
        faulting: bool,
    ) -> Turn {
        let now = Instant::now();
        if let Some(until) = self.cut_until[c] {
            if now < until && faulting {
                return Turn::Skip;
            }
            self.partitions.links[c].heal();
            self.cut_until[c] = None;
            if let Some(at) = self.current[c] {
                history.partitions[at].healed = Some(now);
                // Back on the network, it may keep (or take back) its ledger: a takeover
                // after this would be an ordinary contention, not the partition's.
                self.takeovers_due.retain(|due| *due != at);
            }
            if self.pending[c].is_none() {
                return Turn::Ended;
            }
        }
        if let Some((ledger, seq)) = self.pending[c].clone() {
            let Some(answer) = child.try_reply() else {
                return Turn::Skip;
            };
            self.pending[c] = None;
            if answer.starts_with("ok") {
                acknowledge(history, &child.replica, &ledger, seq);
            } else {
                history.refusals += 1;
            }
            return Turn::Ended;
        }
        let due = self
            .takeovers_due
            .iter()
            .position(|&at| history.partitions[at].replica != child.replica);
        let Some(due) = due else {
            // At least one cut every few seconds of the fault phase: the random 3 % of turns
            // alone can leave a run without any when its replicas are busy with other faults.
            if faulting && self.last_cut.elapsed() >= FORCED_CUT_EVERY {
                let served = history.acks.iter().any(|(_, r, _)| *r == child.replica);
                if served {
                    self.rng ^= self.rng << 13;
                    self.rng ^= self.rng >> 7;
                    self.rng ^= self.rng << 17;
                    self.takeover_seq += 1;
                    let (own, seq, seed) = (
                        format!("{}-own", child.replica),
                        self.takeover_seq,
                        self.rng,
                    );
                    self.cut(c, child, &own, seq, seed, history).await;
                    return Turn::Skip;
                }
            }
            return Turn::Go;
        };
        let at = self.takeovers_due[due];
        let Some(ledger) = history.partitions[at].ledger.clone() else {
            self.takeovers_due.remove(due);
            return Turn::Go;
        };
        let opened = child
            .request(&format!("open {ledger}"))
            .await
            .unwrap_or_default();
        let Some(epoch) = opened.strip_prefix("opened ") else {
            return Turn::Skip; // LeaseHeld until the cut replica's lease expires
        };
        history
            .opened
            .entry(ledger.clone())
            .or_default()
            .push(epoch.parse().expect("epoch"));
        self.takeover_seq += 1;
        let seq = self.takeover_seq;
        let wrote = child
            .request(&format!("write {ledger} {seq}"))
            .await
            .unwrap_or_default();
        if wrote.starts_with("ok") {
            acknowledge(history, &child.replica, &ledger, seq);
            let cut = &mut history.partitions[at];
            cut.taken_over = Some(cut.at.elapsed());
            self.takeovers_due.remove(due);
        } else {
            history.refusals += 1;
        }
        Turn::Skip
    }

    /// Cuts replica `c`'s link for 0.5–3.5 s (from `seed`), once it has served; a shared
    /// ledger it holds, if any,
    /// is then taken over by the others ([`PartitionFaults::turn`]). Half the time a
    /// transaction of it is open across the cut first: `hold` (writes row `seq`, then sleeps
    /// until after the cut ends before committing) on that ledger, or on `own`, its own one,
    /// so its COMMIT comes after the heal, when another replica may have taken the tenant over.
    pub(crate) async fn cut(
        &mut self,
        c: usize,
        child: &mut ReplicaProcess,
        own: &str,
        seq: i64,
        seed: u64,
        history: &mut History,
    ) {
        // A partition of a replica that has not served yet (the run's first moments, before
        // it opened anything) would only stretch the run's cold start.
        if !history
            .acks
            .iter()
            .any(|(_, replica, _)| *replica == child.replica)
        {
            return;
        }
        let millis = 500 + (seed >> 24) % 3000;
        let held = self.held_by(&child.replica).await;
        if std::env::var_os("PGTENANT_HISTORY_DEBUG").is_some() {
            eprintln!("partition: cutting {} holding {held:?}", child.replica);
        }
        let ledger = held.get((seed >> 32) as usize % held.len().max(1)).cloned();
        let mut in_flight = false;
        if (seed >> 40).is_multiple_of(2) {
            let held = ledger.as_deref().unwrap_or(own);
            let answer = child
                .request(&format!("hold {held} {seq} {}", millis + 300))
                .await
                .unwrap_or_default();
            if answer == "holding" {
                in_flight = true;
                self.pending[c] = Some((held.to_owned(), seq));
            } else {
                history.refusals += 1;
            }
        }
        self.partitions.links[c].cut();
        let at = Instant::now();
        self.last_cut = at;
        self.cut_until[c] = Some(at + Duration::from_millis(millis));
        self.current[c] = Some(history.partitions.len());
        if ledger.is_some() {
            self.takeovers_due.push(history.partitions.len());
        }
        history.partitions.push(Cut {
            replica: child.replica.clone(),
            at,
            healed: None,
            ledger,
            in_flight,
            taken_over: None,
        });
    }

    /// Heals every link still cut (the run's end).
    pub(crate) fn heal_all(&mut self, history: &mut History) {
        self.takeovers_due.clear();
        for (c, until) in self.cut_until.iter_mut().enumerate() {
            if until.take().is_some() {
                self.partitions.links[c].heal();
                if let Some(at) = self.current[c] {
                    history.partitions[at].healed = Some(Instant::now());
                }
            }
        }
    }
}

fn acknowledge(history: &mut History, replica: &str, ledger: &str, seq: i64) {
    history
        .acked
        .entry(ledger.to_owned())
        .or_default()
        .insert((replica.to_owned(), seq));
    history
        .acks
        .push((Instant::now(), replica.to_owned(), ledger.to_owned()));
}
