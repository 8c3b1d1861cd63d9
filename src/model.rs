//! What the crate's concurrent bookkeeping locks and signals with in its unit tests: std's and
//! crossbeam's primitives, or Shuttle's when made inside a Shuttle execution, so that a model
//! check controls and explores every interleaving of the critical sections and the waits.
//! Outside one they are std's and crossbeam's, as in a build. Users: the local wait queues
//! (`queue.rs`) with the waiter states the one-master engine keeps in them
//! (`one_master/wait.rs`), and the unlock combiner (`net/pool/combine.rs`), which import these
//! instead of std's only under `cfg(test)`.

use std::ops::{Deref, DerefMut};
use std::sync::{LockResult, PoisonError};

use crossbeam_channel::{RecvError, SendError};

fn modelled() -> bool {
    shuttle::current::try_get_current_task().is_some()
}

pub(crate) enum Mutex<T> {
    Std(std::sync::Mutex<T>),
    Model(shuttle::sync::Mutex<T>),
}

pub(crate) enum MutexGuard<'a, T> {
    Std(std::sync::MutexGuard<'a, T>),
    Model(shuttle::sync::MutexGuard<'a, T>),
}

impl<T> Mutex<T> {
    pub(crate) fn new(value: T) -> Self {
        if modelled() {
            Self::Model(shuttle::sync::Mutex::new(value))
        } else {
            Self::Std(std::sync::Mutex::new(value))
        }
    }

    pub(crate) fn lock(&self) -> LockResult<MutexGuard<'_, T>> {
        match self {
            Self::Std(m) => m
                .lock()
                .map(MutexGuard::Std)
                .map_err(|e| PoisonError::new(MutexGuard::Std(e.into_inner()))),
            Self::Model(m) => m
                .lock()
                .map(MutexGuard::Model)
                .map_err(|e| PoisonError::new(MutexGuard::Model(e.into_inner()))),
        }
    }
}

impl<T: Default> Default for Mutex<T> {
    fn default() -> Self {
        Self::new(T::default())
    }
}

impl<T> Deref for MutexGuard<'_, T> {
    type Target = T;

    fn deref(&self) -> &T {
        match self {
            Self::Std(g) => g,
            Self::Model(g) => g,
        }
    }
}

impl<T> DerefMut for MutexGuard<'_, T> {
    fn deref_mut(&mut self) -> &mut T {
        match self {
            Self::Std(g) => g,
            Self::Model(g) => g,
        }
    }
}

/// The sending end of [`bounded`]: crossbeam's, or Shuttle's, which a model check schedules.
pub(crate) enum Sender<T> {
    Std(crossbeam_channel::Sender<T>),
    Model(shuttle::sync::mpsc::SyncSender<T>),
}

/// The receiving end of [`bounded`].
pub(crate) enum Receiver<T> {
    Std(crossbeam_channel::Receiver<T>),
    Model(shuttle::sync::mpsc::Receiver<T>),
}

/// `crossbeam_channel::bounded`, with crossbeam's errors either way.
pub(crate) fn bounded<T>(cap: usize) -> (Sender<T>, Receiver<T>) {
    if modelled() {
        let (tx, rx) = shuttle::sync::mpsc::sync_channel(cap);
        (Sender::Model(tx), Receiver::Model(rx))
    } else {
        let (tx, rx) = crossbeam_channel::bounded(cap);
        (Sender::Std(tx), Receiver::Std(rx))
    }
}

impl<T> Sender<T> {
    pub(crate) fn send(&self, value: T) -> Result<(), SendError<T>> {
        match self {
            Self::Std(tx) => tx.send(value),
            Self::Model(tx) => tx.send(value).map_err(|e| SendError(e.0)),
        }
    }
}

impl<T> Receiver<T> {
    pub(crate) fn recv(&self) -> Result<T, RecvError> {
        match self {
            Self::Std(rx) => rx.recv(),
            Self::Model(rx) => rx.recv().map_err(|_| RecvError),
        }
    }
}
