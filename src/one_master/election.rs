//! An election on one master: its lock is a lock (acquire, wait, renew and release as for any
//! key); what an election adds is the record of the leader's proclamation beside it, and the
//! channel observers watch. Each call is one script on the master that serves the election's
//! slot, sent again where that is safe (each is idempotent: see the scripts' headers).

use std::sync::{Arc, Weak};

use crossbeam_channel::Sender;

use super::OneMaster;
use crate::error::{Error, Result};
use crate::key::LockKeys;
use crate::net::watch::{self, Heard, On};
use crate::scripts::{self, Proclamation, Who};

impl OneMaster {
    /// See [`Engine::proclaim`](crate::engine::Engine::proclaim). With replica
    /// acknowledgement configured, a proclamation too waits for the replicas, as a grant does:
    /// one a failover could lose would leave observers without the leader, or with an older
    /// value, while the leadership itself survived.
    pub(crate) fn proclaim(
        &self,
        keys: &LockKeys,
        record: &str,
        p: &Proclamation<'_>,
    ) -> Result<bool> {
        let acks = self.config.replica_acks;
        let (stands, acked) = self.router.run(keys.lock(), |con, _| {
            scripts::proclaim(con, keys, record, p, acks)
        })?;
        match (acks, acked) {
            (Some(acks), Some(acked)) if stands && acked < acks.replicas => {
                Err(Error::NotReplicated {
                    acked,
                    required: acks.replicas,
                })
            }
            _ => Ok(stands),
        }
    }

    /// See [`Engine::resign`](crate::engine::Engine::resign).
    pub(crate) fn resign(&self, keys: &LockKeys, record: &str, owner: &str) -> Result<()> {
        self.router
            .run(keys.lock(), |con, _| scripts::resign(con, record, owner))
            .map(drop)
    }

    /// See [`Engine::leader`](crate::engine::Engine::leader).
    pub(crate) fn leader(&self, keys: &LockKeys, record: &str) -> Result<Who> {
        self.router
            .run(keys.lock(), |con, _| scripts::leader(con, keys, record))
    }

    /// See [`Engine::watch`](crate::engine::Engine::watch): one subscription, on the
    /// deployment's subscriber node. The master publishes each proclamation in the script that
    /// records it, so what it says was, when said, the truth.
    pub(crate) fn watch(
        &self,
        channel: &str,
        inbox: Sender<Heard>,
        alive: Weak<()>,
    ) -> std::io::Result<bool> {
        watch::spawn(
            Arc::clone(self.router.connector()),
            On::Deployment,
            channel.to_owned(),
            self.config.connection_timeout,
            inbox,
            alive,
        )?;
        Ok(true)
    }
}
