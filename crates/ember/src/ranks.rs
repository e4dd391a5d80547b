//! The ranks a training command runs as: one process alone, or, in a build with the `mpi` feature, the ranks of an
//! `mpiexec -n N ember train …` launch (data parallelism; see README, "Training on several devices").

use std::rc::Rc;

use anyhow::Result;
use ember_train::collective::{Collective, Single};

/// A collective that can move to the thread that runs the command.
pub type Launch = Box<dyn Collective + Send>;

/// Joins the MPI launch this process belongs to (a process started without `mpiexec` is a launch of one). Under a
/// launcher the rank runs sheltered in a child process (see `collective::mpi::shelter`), so that it can name a lost
/// rank before the launcher's kill ends it; this must run before any thread starts.
#[cfg(feature = "mpi")]
pub fn join() -> Result<Launch> {
    ember_train::collective::mpi::shelter();
    Ok(Box::new(ember_train::collective::mpi::Mpi::init()?))
}

/// Without MPI every process trains alone.
#[cfg(not(feature = "mpi"))]
pub fn join() -> Result<Launch> {
    Ok(Box::new(Single))
}

/// One process alone.
pub fn single() -> Launch {
    Box::new(Single)
}

/// Sizes rayon's pool to this rank's share of the machine's cores (the ranks on one machine split them), unless
/// RAYON_NUM_THREADS says otherwise. Must run before anything uses the pool.
pub fn share_cores(launch: &Launch) -> Result<()> {
    let local = launch.local_ranks();
    if local > 1 && std::env::var_os("RAYON_NUM_THREADS").is_none() {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        rayon::ThreadPoolBuilder::new().num_threads((cores / local).max(1)).build_global()?;
    }
    Ok(())
}

/// The launch as the training loop holds it.
pub fn shared(launch: Launch) -> Rc<dyn Collective> {
    Rc::from(launch as Box<dyn Collective>)
}

/// Each rank's first line when there are several: its pid, its device and its threads.
pub fn announce(collective: &dyn Collective, device: &str) {
    if collective.ranks() > 1 {
        let (rank, ranks, pid, threads) =
            (collective.rank(), collective.ranks(), std::process::id(), rayon::current_num_threads());
        println!("rank {rank} of {ranks}: pid {pid}, {device}, {threads} threads");
    }
}

/// Each rank's last line when there are several: the step it reached and its parameters' fingerprint, equal on every
/// rank when the replicas agree.
pub fn report_end(collective: &dyn Collective, step: u64, fingerprint: u64) {
    if collective.ranks() > 1 {
        println!("rank {} of {}: step {step}, parameters {fingerprint:016x}", collective.rank(), collective.ranks());
    }
}

/// `result`, unless it is an error on one of several ranks: then the error is printed with the rank and every rank
/// is ended, so none waits for a rank that has stopped.
pub fn end_all_on_error<T>(result: Result<T>, collective: &dyn Collective) -> Result<T> {
    if let Err(e) = &result
        && collective.ranks() > 1
    {
        eprintln!("error: rank {}: {}", collective.rank(), format!("{e:#}").replace('\n', " "));
        collective.abort(1);
    }
    result
}
