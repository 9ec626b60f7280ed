//! The methods the blocking and the tokio API share word for word (nothing
//! in them waits on the network): one text, expanded in each
//! (`lock_builder!` in `impl Lock`, `guard_reads!` in `impl Guard`), so the
//! two cannot drift. Each `Lock` has `shared.kind`, `shared.status` (a std
//! mutex over, or dereferencing to, [`crate::holding::Holding`]), `opts`
//! and `Lock::new(client, kind)`; each `Guard` has `shared()`.

/// The constructors and options of a `Lock`; `$lock` locks its status.
macro_rules! lock_builder {
    ($lock:ident) => {
        /// An exclusive lock (`LOCK.ACQUIRE`).
        pub fn exclusive(client: impl Into<crate::Target>, key: impl AsRef<[u8]>) -> Self {
            Self::new(client.into(), crate::Kind::Exclusive(key.as_ref().to_vec()))
        }

        /// A reentrant exclusive lock (`LOCK.RACQUIRE`), as Redisson's `RLock`:
        /// [`Guard::reacquire`] adds a hold.
        pub fn reentrant(client: impl Into<crate::Target>, key: impl AsRef<[u8]>) -> Self {
            Self::new(client.into(), crate::Kind::Reentrant(key.as_ref().to_vec()))
        }

        /// The read side of a read-write lock (`LOCK.READ`): shared.
        pub fn read(client: impl Into<crate::Target>, key: impl AsRef<[u8]>) -> Self {
            Self::new(client.into(), crate::Kind::Read(key.as_ref().to_vec()))
        }

        /// The write side of a read-write lock: exclusive and reentrant
        /// (`LOCK.RACQUIRE`), with writer preference.
        pub fn write(client: impl Into<crate::Target>, key: impl AsRef<[u8]>) -> Self {
            Self::new(client.into(), crate::Kind::Reentrant(key.as_ref().to_vec()))
        }

        /// One permit of a semaphore of `limit` permits (`LOCK.SEMAPHORE`).
        pub fn semaphore(
            client: impl Into<crate::Target>,
            key: impl AsRef<[u8]>,
            limit: u32,
        ) -> Self {
            Self::new(
                client.into(),
                crate::Kind::Semaphore(key.as_ref().to_vec(), limit),
            )
        }

        /// Every key or none (`LOCK.MACQUIRE`); [`Guard::tokens`] per key. No
        /// key, a repeated key or more than 1000 keys: [`crate::Error::Invalid`].
        pub fn multi<K: AsRef<[u8]>>(
            client: impl Into<crate::Target>,
            keys: impl IntoIterator<Item = K>,
        ) -> Self {
            Self::new(
                client.into(),
                crate::Kind::Multi(keys.into_iter().map(|k| k.as_ref().to_vec()).collect()),
            )
        }

        /// The lease (default 30 s), renewed while held.
        pub fn ttl(mut self, ttl: std::time::Duration) -> Self {
            self.opts.ttl = ttl;
            self
        }

        /// How long to wait in the server. Default `None`: do not wait (one
        /// try); `Duration::MAX`: without limit.
        pub fn wait(mut self, wait: Option<std::time::Duration>) -> Self {
            self.opts.wait = wait;
            self
        }

        /// The owner id for every acquisition of this object (every kind sends
        /// it). By default a fresh UUID per acquisition: a stable id only if you
        /// mean it (re-entrancy across objects, or a mode change refused).
        pub fn owner(self, owner: impl AsRef<[u8]>) -> Self {
            {
                let mut st = $lock(&self.shared.status);
                st.owner = owner.as_ref().to_vec();
                st.fixed = true;
            }
            self
        }

        /// `BIND` (default): the server frees the lock when the holder's
        /// connection closes. `false`: a lease renewed with `LOCK.RENEW`.
        pub fn bind(mut self, bind: bool) -> Self {
            self.opts.bind = bind;
            self
        }

        /// The connect timeout and the longest a reply may take beyond the
        /// acquire's wait (default 2 s); a renewal or a release also never
        /// waits past what is left of the lease.
        pub fn timeout(mut self, timeout: std::time::Duration) -> Self {
            self.opts.timeout = timeout;
            self
        }

        /// Called (on the watchdog: a thread, a task in tokio) when a lease is
        /// found lost, with the [`crate::Error::LeaseLost`] the holder will get.
        pub fn on_lost(self, f: impl Fn(&crate::Error) + Send + Sync + 'static) -> Self {
            $lock(&self.shared.status).on_lost = Some(std::sync::Arc::new(f));
            self
        }

        /// Durable grants: `WAIT replicas timeout` right after each grant and
        /// each renewal, on the connection that carried it (that reply may take
        /// the timeout plus [`Lock::timeout`]). A grant fewer replicas
        /// acknowledged is released and the acquire returns
        /// [`crate::Error::NotDurable`] (or, with [`Lock::allow_not_durable`], the
        /// guard with [`Guard::durable`] `Some(false)`); a renewal fewer
        /// acknowledged keeps the lease and calls [`Lock::on_not_durable`]. 0
        /// (default): no `WAIT`. Not on a cluster ([`crate::Error::Invalid`]).
        pub fn replicas(mut self, replicas: u32, timeout: std::time::Duration) -> Self {
            self.opts.replicas = replicas;
            self.opts.replicas_timeout = timeout;
            self
        }

        /// Keep a grant fewer replicas acknowledged than [`Lock::replicas`]
        /// asked for, flagged ([`Guard::durable`] `Some(false)`), instead of
        /// releasing it with [`crate::Error::NotDurable`].
        pub fn allow_not_durable(mut self, allow: bool) -> Self {
            self.opts.allow_not_durable = allow;
            self
        }

        /// Called (on the watchdog) when a renewal (or an extend) is
        /// acknowledged by fewer replicas than [`Lock::replicas`] asked for,
        /// with [`crate::Error::NotDurable`] (or the `WAIT`'s own failure); the lease
        /// is kept and [`Guard::durable`] turns `Some(false)` until a renewal is
        /// acknowledged again.
        pub fn on_not_durable(self, f: impl Fn(&crate::Error) + Send + Sync + 'static) -> Self {
            $lock(&self.shared.status).on_not_durable = Some(std::sync::Arc::new(f));
            self
        }

        pub fn keys(&self) -> Vec<Vec<u8>> {
            self.shared.kind.keys()
        }

        /// The owner id the current (or next) acquisition uses.
        pub fn owner_id(&self) -> Vec<u8> {
            $lock(&self.shared.status).owner.clone()
        }
    };
}

pub(crate) use lock_builder;

/// What a `Guard` reads of its acquisition; `$lock` locks the status.
macro_rules! guard_reads {
    ($lock:ident) => {
        /// The fencing token (a multi-key lock: the highest of [`Guard::tokens`]).
        pub fn token(&self) -> i64 {
            $lock(&self.shared().status).token()
        }

        /// The tokens per key, in key order.
        pub fn tokens(&self) -> Vec<i64> {
            $lock(&self.shared().status).tokens.clone()
        }

        /// With `Lock::replicas`: whether the grant and the last renewal were
        /// each acknowledged by that many replicas; `None` without it.
        pub fn durable(&self) -> Option<bool> {
            $lock(&self.shared().status).durable
        }

        /// The id of the session the grant follows; `None` outside a session.
        pub fn session_id(&self) -> Option<i64> {
            $lock(&self.shared().status).session
        }

        /// Whether the lock is bound to the holder's connection (`BIND`).
        pub fn is_bound(&self) -> bool {
            $lock(&self.shared().status).bound
        }

        /// True once the lease is known lost, or may have run out; it stays
        /// true. Never waits on the network.
        pub fn is_lost(&self) -> bool {
            let s = self.shared();
            let (lost, news) = {
                let mut st = $lock(&s.status);
                let news = st.check_lost(&s.kind);
                (st.lost.is_some(), news)
            };
            tell(news);
            lost
        }

        /// `Err(LeaseLost)` if the lease is gone: call it before a protected write.
        pub fn check(&self) -> Result<(), crate::Error> {
            if self.is_lost() {
                let s = self.shared();
                return Err($lock(&s.status).lost_error(&s.kind));
            }
            Ok(())
        }
    };
}

pub(crate) use guard_reads;
