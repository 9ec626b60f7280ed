//! A holder's connection of its own (blocking): to a server, or to a
//! cluster, with its timeouts; used by the blocking locks and by every
//! session's keeper.

use std::thread;
use std::time::Duration;

use crate::commands::Exchange;
use crate::Target;

/// A holder's connection: to the server, or to the cluster.
pub(crate) enum Conn {
    Server(redis::Connection),
    Cluster(Box<redis::cluster::ClusterConnection>),
}

impl Conn {
    /// A connection with a connect timeout and read/write timeouts. The
    /// `redis` crate's handshake reads with the timeout per read (several
    /// reads): it runs on a thread of its own, given up after `timeout`.
    pub(crate) fn open(target: &Target, timeout: Duration) -> redis::RedisResult<Conn> {
        let (tx, rx) = std::sync::mpsc::channel();
        let target = target.clone();
        thread::Builder::new()
            .name("redis-native-lock-connect".into())
            .spawn(move || {
                let _ = tx.send(Conn::open_now(&target, timeout));
            })
            .map_err(redis::RedisError::from)?;
        rx.recv_timeout(timeout)
            .unwrap_or_else(|_| Err(crate::timed_out("no connection within the timeout")))
    }

    fn open_now(target: &Target, timeout: Duration) -> redis::RedisResult<Conn> {
        let conn = match target {
            Target::Server(c) => Conn::Server(c.get_connection_with_timeout(timeout)?),
            Target::Cluster(c) => {
                let config = redis::cluster::ClusterConfig::new()
                    .set_connection_timeout(timeout)
                    .set_response_timeout(timeout);
                Conn::Cluster(Box::new(c.get_connection_with_config(config)?))
            }
        };
        conn.timeouts(Some(timeout))?;
        Ok(conn)
    }

    /// Read and write timeouts (`None`: a read waits as long as it takes).
    pub(crate) fn timeouts(&self, read: Option<Duration>) -> redis::RedisResult<()> {
        let write = read.or(Some(crate::DEFAULT_TIMEOUT));
        match self {
            Conn::Server(c) => {
                c.set_read_timeout(read)?;
                c.set_write_timeout(write)
            }
            Conn::Cluster(c) => {
                c.set_read_timeout(read)?;
                c.set_write_timeout(write)
            }
        }
    }

    pub(crate) fn query(&mut self, cmd: &redis::Cmd) -> redis::RedisResult<redis::Value> {
        match self {
            Conn::Server(c) => cmd.query(c),
            Conn::Cluster(c) => cmd.query(&mut **c),
        }
    }

    /// `cmd` to `node` ("host:port" in a cluster; on a server, the server).
    pub(crate) fn on_node(
        &mut self,
        node: &str,
        cmd: &redis::Cmd,
    ) -> redis::RedisResult<redis::Value> {
        use redis::cluster_routing::{RoutingInfo, SingleNodeRoutingInfo};
        match self {
            Conn::Server(c) => cmd.query(c),
            Conn::Cluster(c) if node.is_empty() => {
                c.route_command(cmd, RoutingInfo::SingleNode(SingleNodeRoutingInfo::Random))
            }
            Conn::Cluster(c) => {
                let (host, port) = node.rsplit_once(':').unwrap_or((node, ""));
                let port = port.parse().map_err(|_| {
                    redis::RedisError::from((
                        redis::ErrorKind::Client,
                        "a node address without a port",
                        node.to_string(),
                    ))
                })?;
                let routing = RoutingInfo::SingleNode(SingleNodeRoutingInfo::ByAddress {
                    host: host.to_string(),
                    port,
                });
                c.route_command(cmd, routing)
            }
        }
    }

    pub(crate) fn query_pipe(
        &mut self,
        p: &redis::Pipeline,
    ) -> redis::RedisResult<Vec<redis::Value>> {
        match self {
            Conn::Server(c) => p.query(c),
            Conn::Cluster(c) => p.query(&mut **c),
        }
    }

    /// Sends `e`'s commands one by one, each reply handed back to it.
    pub(crate) fn run<E: Exchange>(&mut self, mut e: E) -> redis::RedisResult<E::Outcome> {
        while let Some(cmd) = e.next() {
            let reply = self.query(cmd);
            e.reply(reply)?;
        }
        Ok(e.outcome())
    }
}
