//! [`Collective`] over MPI: the ranks of an `mpiexec` launch, on one machine or several. MPI is initialised with
//! `MPI_THREAD_SERIALIZED`, so the trainer may call it from whichever thread runs it, one call at a time.
//!
//! A rank that dies ends the launch, never a hang, and the survivors on its machine name it. The launcher kills
//! every survivor the moment one rank dies (MPICH's hydra sends SIGKILL to each rank's process group, even under
//! `-disable-auto-cleanup`, 0.3 ms after its SIGUSR1), which leaves a rank no time to speak. So [`shelter`] runs each
//! rank in a child process of its own process group: the launcher's kill reaches the small parent, whose death
//! reaches the rank as SIGTERM, and the rank names the lost rank before it exits. While waiting in a collective a rank
//! also checks every 20 ms that the ranks on its machine are alive, so a launcher that does not kill cannot leave it
//! waiting forever.

use std::ffi::CString;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};
use std::time::{Duration, Instant};

use mpi::Threading;
use mpi::collective::SystemOperation;
use mpi::environment::Universe;
use mpi::request::{Request, Scope};
use mpi::topology::SimpleCommunicator;
use mpi::traits::*;

use super::{Collective, fingerprint};

/// Elements per `MPI_Allreduce` (MPI counts are C ints; 64 MiB of f32 keeps each call's copy small).
const CHUNK: usize = 1 << 24;

#[derive(Debug, thiserror::Error)]
pub enum MpiError {
    #[error("MPI was initialised already")]
    Initialised,
    #[error("the MPI library offers {0:?} threading; Ember needs Serialized")]
    Threading(Threading),
}

/// This process's place in an MPI launch.
pub struct Mpi {
    world: SimpleCommunicator,
    /// The ranks on this machine (they share its cores and its GPUs).
    local: SimpleCommunicator,
    host: String,
    /// Dropped last: finalises MPI.
    _universe: Universe,
}

// SAFETY: MPI runs at MPI_THREAD_SERIALIZED, which permits calls from any thread provided no two overlap; an `Mpi`
// is used through `&self` by the one thread that trains.
unsafe impl Send for Mpi {}

impl Mpi {
    /// Joins the launch this process belongs to; a process started without `mpiexec` is a launch of one rank.
    pub fn init() -> Result<Self, MpiError> {
        let (universe, provided) =
            mpi::initialize_with_threading(Threading::Serialized).ok_or(MpiError::Initialised)?;
        if matches!(provided, Threading::Single | Threading::Funneled) {
            return Err(MpiError::Threading(provided));
        }
        let world = universe.world();
        let local = world.split_shared(world.rank());
        let host = mpi::environment::processor_name().unwrap_or_else(|_| "?".into());
        let mpi = Self { world, local, host, _universe: universe };
        mpi.watch_for_lost_ranks();
        Ok(mpi)
    }

    /// The machine's name as MPI reports it.
    pub fn host(&self) -> &str {
        &self.host
    }

    /// Learns every rank's process id and machine, and installs the signal handlers.
    fn watch_for_lost_ranks(&self) {
        let n = self.world.size() as usize;
        let pid = std::process::id();
        let host = fingerprint(self.host.as_bytes());
        let (mut pids, mut hosts) = (vec![0u32; n], vec![0u64; n]);
        self.world.all_gather_into(&pid, &mut pids[..]);
        self.world.all_gather_into(&host, &mut hosts[..]);
        let me = self.rank();
        let here: Vec<(CString, String)> = (0..n)
            .filter(|&r| r != me && hosts[r] == host)
            .map(|r| {
                let stat = CString::new(format!("/proc/{}/stat", pids[r])).expect("no NUL in a path of digits");
                (stat, format!("error: rank {r} (pid {} on {}) was lost; rank {me} stops\n", pids[r], self.host))
            })
            .collect();
        let elsewhere = format!("error: a rank on another machine was lost; rank {me} stops\n");
        let stopped = format!("error: rank {me} was stopped by the launcher\n");
        if WATCHED.set(Watched { here, elsewhere, stopped }).is_ok() {
            // SAFETY: the handlers only touch an atomic or WATCHED (set before they are installed) and call
            // async-signal-safe functions (open, read, close, write, nanosleep, signal, _exit).
            unsafe {
                libc::signal(libc::SIGUSR1, on_failure_report as *const () as libc::sighandler_t);
                libc::signal(libc::SIGABRT, on_abort as *const () as libc::sighandler_t);
                libc::signal(libc::SIGTERM, on_stop as *const () as libc::sighandler_t);
            }
        }
    }

    /// Completes a non-blocking collective, checking every 20 ms that this machine's other ranks are alive: a lost
    /// rank is named and this one exits. After the launcher reports a failure with every local rank alive, the lost
    /// rank is on another machine: said after a second, and this one exits.
    fn complete<'a, D: ?Sized, S: Scope<'a>>(&self, mut request: Request<'a, D, S>) {
        let watched = WATCHED.get().expect("watch_for_lost_ranks ran at init");
        let (mut checked, mut reported) = (Instant::now(), None);
        loop {
            match request.test() {
                Ok(_) => return,
                Err(pending) => request = pending,
            }
            if checked.elapsed() < CHECK_EVERY {
                continue;
            }
            checked = Instant::now();
            if name_lost(watched, 1) {
                // SAFETY: ends the process at once; MPI cannot be finalised with a rank missing.
                unsafe { libc::_exit(1) };
            }
            if FAILURE_REPORTED.load(Ordering::Relaxed)
                && reported.get_or_insert_with(Instant::now).elapsed() > Duration::from_secs(1)
            {
                say(&watched.elsewhere);
                // SAFETY: as above.
                unsafe { libc::_exit(1) };
            }
        }
    }
}

/// How often a rank waiting in a collective checks the others on its machine.
const CHECK_EVERY: Duration = Duration::from_millis(20);

/// The ranks a lost-rank check looks at: those on this machine (`/proc/PID/stat`, message), and the message for a
/// rank lost elsewhere.
struct Watched {
    here: Vec<(CString, String)>,
    elsewhere: String,
    /// For a stop with no rank of this machine lost.
    stopped: String,
}

static WATCHED: OnceLock<Watched> = OnceLock::new();

/// Set by SIGUSR1, MPICH's notice (under `-disable-auto-cleanup`) that a process of the launch failed.
static FAILURE_REPORTED: AtomicBool = AtomicBool::new(false);

/// Names the lost ranks of this machine and exits at once (the launcher may not wait long); a failure elsewhere is
/// left to the waiting collective.
extern "C" fn on_failure_report(_signal: libc::c_int) {
    if WATCHED.get().is_some_and(|watched| name_lost(watched, 1)) {
        // SAFETY: ends the process without running destructors, as a signal handler must.
        unsafe { libc::_exit(1) };
    }
    FAILURE_REPORTED.store(true, Ordering::Relaxed);
}

/// SIGTERM: the launcher stopped the rank (in a sheltered rank, the parent was killed): names the lost ranks of this
/// machine, giving a rank killed a moment ago a second to be seen gone, or says it was stopped; then exits.
extern "C" fn on_stop(_signal: libc::c_int) {
    if let Some(watched) = WATCHED.get()
        && !name_lost(watched, 50)
    {
        say(&watched.stopped);
    }
    // SAFETY: ends the process without running destructors, as a signal handler must.
    unsafe { libc::_exit(1) };
}

/// An abort, which is how the transport (UCX) ends a rank whose peer vanished mid-transfer: names the lost ranks of
/// this machine and exits; an abort with every rank of this machine alive is not about a lost rank and proceeds.
extern "C" fn on_abort(_signal: libc::c_int) {
    if WATCHED.get().is_some_and(|watched| name_lost(watched, 50)) {
        // SAFETY: ends the process without running destructors, as a signal handler must.
        unsafe { libc::_exit(1) };
    }
    // SAFETY: with the default action back, the abort under way ends the process when the handler returns.
    unsafe { libc::signal(libc::SIGABRT, libc::SIG_DFL) };
}

/// Writes `message` to stderr (async-signal-safe).
fn say(message: &str) {
    // SAFETY: write(2) of a live buffer to stderr.
    unsafe { libc::write(2, message.as_ptr().cast(), message.len()) };
}

/// Names the ranks of this machine that are gone, looking up to `tries` times 20 ms apart; whether any was.
/// Async-signal-safe.
fn name_lost(watched: &Watched, tries: usize) -> bool {
    let pause = libc::timespec { tv_sec: 0, tv_nsec: 20_000_000 };
    for attempt in 0..tries {
        let mut named = false;
        for (stat, message) in &watched.here {
            if !alive(stat) {
                say(message);
                named = true;
            }
        }
        if named {
            return true;
        }
        if attempt + 1 < tries {
            // SAFETY: nanosleep with a valid duration and no remainder wanted.
            unsafe { libc::nanosleep(&pause, std::ptr::null_mut()) };
        }
    }
    false
}

/// Whether the process whose `/proc/PID/stat` this is still runs: it exists, is not exiting (PF_EXITING is set the
/// moment a kill takes effect, while the memory of a large process is still being torn down) and is not a zombie
/// (as a killed rank stays until its launcher reaps it). Uses only open, read and close, which are async-signal-safe.
fn alive(stat: &CString) -> bool {
    let mut buf = [0u8; 512];
    // SAFETY: a NUL-terminated path; a stack buffer of the length given; the descriptor is closed once.
    let read = unsafe {
        let fd = libc::open(stat.as_ptr(), libc::O_RDONLY);
        if fd < 0 {
            return false;
        }
        let read = libc::read(fd, buf.as_mut_ptr().cast(), buf.len());
        libc::close(fd);
        read
    };
    let text = &buf[..read.max(0) as usize];
    // "PID (COMMAND) STATE PPID PGRP SESSION TTY TPGID FLAGS …": the fields after the last ')'.
    let Some(close) = text.iter().rposition(|&b| b == b')') else { return false };
    let mut fields = text[close + 1..].split(|&b| b == b' ').filter(|f| !f.is_empty());
    let state = fields.next().and_then(|f| f.first().copied());
    let flags = fields
        .nth(5)
        .map(|f| f.iter().take_while(|b| b.is_ascii_digit()).fold(0u64, |n, &b| n * 10 + (b - b'0') as u64));
    const PF_EXITING: u64 = 0x4;
    !matches!(state, None | Some(b'Z' | b'X')) && flags.is_some_and(|f| f & PF_EXITING == 0)
}

/// The sheltered rank's process id, for the parent's signal forwarding.
static RANK_PID: AtomicI32 = AtomicI32::new(0);

/// When this process was started by an MPI launcher, forks: the child returns and becomes the rank, in a process
/// group of its own, and receives SIGTERM when the parent dies; the parent stays behind for the launcher, passes on
/// the signals the launcher sends (SIGINT, SIGTERM, SIGUSR1, SIGHUP) and exits as the rank did, never returning.
/// Must run before any thread starts. A process started without a launcher, or whose fork fails, goes on as it is.
pub fn shelter() {
    let launched =
        ["PMI_RANK", "PMI_FD", "PMIX_RANK", "OMPI_COMM_WORLD_RANK"].iter().any(|v| std::env::var_os(v).is_some());
    if !launched {
        return;
    }
    // SAFETY: no other thread runs yet, so the child may go on running Rust code after fork.
    let parent = unsafe { libc::getpid() };
    let child = unsafe { libc::fork() };
    if child < 0 {
        return;
    }
    if child == 0 {
        // SAFETY: plain process-control calls on this process; a parent already gone is caught by getppid.
        unsafe {
            libc::setpgid(0, 0);
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM);
            if libc::getppid() != parent {
                libc::_exit(1);
            }
        }
        return;
    }
    RANK_PID.store(child, Ordering::Relaxed);
    // SAFETY: the handler only reads an atomic and calls kill, which is async-signal-safe.
    unsafe {
        for signal in [libc::SIGINT, libc::SIGTERM, libc::SIGUSR1, libc::SIGHUP] {
            libc::signal(signal, pass_on as *const () as libc::sighandler_t);
        }
    }
    let mut status = 0;
    // SAFETY: waits for our own child; an interrupted wait (a signal passed on) is retried.
    while unsafe { libc::waitpid(child, &mut status, 0) } < 0 {}
    // SAFETY: exit as the rank did: its status, or its signal with the default action.
    unsafe {
        if libc::WIFSIGNALED(status) {
            libc::signal(libc::WTERMSIG(status), libc::SIG_DFL);
            libc::raise(libc::WTERMSIG(status));
        }
        libc::_exit(libc::WEXITSTATUS(status));
    }
}

extern "C" fn pass_on(signal: libc::c_int) {
    // SAFETY: kill is async-signal-safe.
    unsafe { libc::kill(RANK_PID.load(Ordering::Relaxed), signal) };
}

impl Collective for Mpi {
    fn rank(&self) -> usize {
        self.world.rank() as usize
    }

    fn ranks(&self) -> usize {
        self.world.size() as usize
    }

    fn all_reduce_sum(&self, buf: &mut [f32]) {
        for chunk in buf.chunks_mut(CHUNK) {
            let send = chunk.to_vec();
            mpi::request::scope(|scope| {
                self.complete(self.world.immediate_all_reduce_into(scope, &send[..], chunk, SystemOperation::sum()))
            });
        }
    }

    /// max(v) and max(!v) = !min(v) in one reduction: equal when every rank sent the same v.
    fn agree(&self, value: u64) -> bool {
        let send = [value, !value];
        let mut max = [0u64; 2];
        mpi::request::scope(|scope| {
            self.complete(self.world.immediate_all_reduce_into(scope, &send[..], &mut max[..], SystemOperation::max()))
        });
        max[0] == !max[1]
    }

    fn barrier(&self) {
        self.complete(self.world.immediate_barrier());
    }

    fn local_rank(&self) -> usize {
        self.local.rank() as usize
    }

    fn local_ranks(&self) -> usize {
        self.local.size() as usize
    }

    fn abort(&self, code: i32) -> ! {
        self.world.abort(code)
    }
}
