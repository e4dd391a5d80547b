//! [`Collective`] over MPI: the ranks of an `mpiexec` launch, on one machine or several. MPI is initialised with
//! `MPI_THREAD_SERIALIZED`, so the trainer may call it from whichever thread runs it, one call at a time.
//!
//! A rank that dies ends the launch: by default `mpiexec` (MPICH's hydra, Open MPI's mpirun) kills the others at
//! once. With MPICH's `-disable-auto-cleanup` it signals them instead (SIGUSR1), and each survivor names the ranks
//! it lost on its own machine before it exits.

use std::ffi::CString;
use std::sync::OnceLock;

use mpi::Threading;
use mpi::collective::SystemOperation;
use mpi::environment::Universe;
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

    /// Learns every rank's process id and machine, and installs the SIGUSR1 handler that names the lost ones.
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
        if WATCHED.set(Watched { here, elsewhere }).is_ok() {
            // SAFETY: the handler only reads WATCHED (set before it is installed) and calls async-signal-safe
            // functions (open, read, close, write, signal, raise, _exit).
            unsafe {
                libc::signal(libc::SIGUSR1, on_lost_rank as *const () as libc::sighandler_t);
                libc::signal(libc::SIGABRT, on_lost_rank as *const () as libc::sighandler_t);
            }
        }
    }
}

/// Ranks a SIGUSR1 may be about: those on this machine (`/proc/PID/stat`, message) and the message for the others.
struct Watched {
    here: Vec<(CString, String)>,
    elsewhere: String,
}

static WATCHED: OnceLock<Watched> = OnceLock::new();

/// Whether the process whose `/proc/PID/stat` this is still runs: it exists and is not a zombie (a killed rank stays
/// one until its launcher reaps it). Uses only open, read and close, which are async-signal-safe.
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
    // "PID (COMMAND) STATE …": the state follows the last ')'.
    let state = text.iter().rposition(|&b| b == b')').and_then(|i| text.get(i + 2));
    !matches!(state, None | Some(b'Z' | b'X'))
}

/// MPICH's notice that a process of the launch failed (SIGUSR1), or an abort, which is how the transport (UCX) ends a
/// rank whose peer vanished mid-transfer: names the ranks of this machine that are gone (the others cannot be looked
/// up from here) and exits. An abort with every rank of this machine alive is not about a lost rank: it proceeds.
extern "C" fn on_lost_rank(signal: libc::c_int) {
    let Some(watched) = WATCHED.get() else { return };
    let say = |message: &str| {
        // SAFETY: write(2) of a live buffer to stderr.
        unsafe { libc::write(2, message.as_ptr().cast(), message.len()) };
    };
    // A process killed a moment ago may still be tearing down (neither gone nor a zombie yet): look for a second.
    let pause = libc::timespec { tv_sec: 0, tv_nsec: 20_000_000 };
    let mut named = false;
    for _ in 0..50 {
        for (stat, message) in &watched.here {
            if !alive(stat) {
                say(message);
                named = true;
            }
        }
        if named {
            break;
        }
        // SAFETY: nanosleep with a valid duration and no remainder wanted.
        unsafe { libc::nanosleep(&pause, std::ptr::null_mut()) };
    }
    match (named, signal == libc::SIGABRT) {
        // SAFETY: with the default action back, the abort under way ends the process when the handler returns.
        (false, true) => unsafe {
            libc::signal(libc::SIGABRT, libc::SIG_DFL);
            return;
        },
        (false, false) => say(&watched.elsewhere),
        (true, _) => {}
    }
    // SAFETY: ends the process without running destructors, as a signal handler must.
    unsafe { libc::_exit(1) };
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
            self.world.all_reduce_into(&send[..], chunk, SystemOperation::sum());
        }
    }

    /// max(v) and max(!v) = !min(v) in one reduction: equal when every rank sent the same v.
    fn agree(&self, value: u64) -> bool {
        let send = [value, !value];
        let mut max = [0u64; 2];
        self.world.all_reduce_into(&send[..], &mut max[..], SystemOperation::max());
        max[0] == !max[1]
    }

    fn barrier(&self) {
        self.world.barrier();
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
