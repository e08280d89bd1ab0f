//! Connections to a URL of several hosts (a failover cluster) that skip a host which has just
//! failed to accept one.
//!
//! tokio-postgres tries a URL's hosts in their order, each for up to its connect timeout. While
//! a primary is cut off from the network (no reset comes back), every new connection would wait
//! that timeout on it before trying the next host, also after the standby has been promoted: a
//! service's pool pays it once per connection it opens, and a client's retry lands on it. So
//! each host is connected to on its own, and one whose socket could not be opened (timed out,
//! refused, unreachable) is left out for [`DOWN_FOR`]; when every host is left out, all are
//! tried again in the URL's order. A host that answers but is refused (a standby where the URL
//! wants writes, a failed login) is not left out.

use std::io::ErrorKind;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use tokio_postgres::config::Host;
use tokio_postgres::{Client, Config, Connection, NoTls, Socket, tls::NoTlsStream};

/// How long a host that failed to accept a connection is left out: longer than a failover
/// takes, so that every connection opened during one skips it, and short enough that a server
/// that comes back (a healed partition, a restart) is soon tried again.
pub(super) const DOWN_FOR: Duration = Duration::from_secs(10);

pub(super) struct Hosts {
    /// One configuration per host of the URL, in its order (one only when it names one).
    each: Vec<Config>,
    /// When each host last failed to accept a connection.
    failed_at: Mutex<Vec<Option<Instant>>>,
}

impl Hosts {
    pub(super) fn new(config: &Config) -> Self {
        let each = single_hosts(config);
        let failed_at = Mutex::new(vec![None; each.len()]);
        Self { each, failed_at }
    }

    /// A connection to the first host, in [`order`], that takes it; the last host's error when
    /// none does.
    pub(super) async fn connect(&self) -> Result<(Client, Connection<Socket, NoTlsStream>), tokio_postgres::Error> {
        let tried = {
            let failed_at = self.failed_at.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            order(&failed_at, Instant::now())
        };
        let mut last = None;
        for index in tried {
            match self.each[index].connect(NoTls).await {
                Ok(connected) => return Ok(connected),
                Err(error) => {
                    if self.each.len() > 1 && unreachable(&error) {
                        let mut failed_at = self.failed_at.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
                        failed_at[index] = Some(Instant::now());
                    }
                    last = Some(error);
                }
            }
        }
        match last {
            Some(error) => Err(error),
            // No host at all: tokio-postgres's own error for it.
            None => Config::new().connect(NoTls).await,
        }
    }
}

/// The hosts to try, by index: those that have not failed to accept a connection within
/// [`DOWN_FOR`] of `now`, in the URL's order, or every host when that leaves none.
pub(super) fn order(failed_at: &[Option<Instant>], now: Instant) -> Vec<usize> {
    let up: Vec<usize> = (0..failed_at.len())
        .filter(|&index| failed_at[index].is_none_or(|at| now.saturating_duration_since(at) >= DOWN_FOR))
        .collect();
    if up.is_empty() { (0..failed_at.len()).collect() } else { up }
}

/// Whether `error` says the host's socket could not be opened, as opposed to a server that
/// answered.
fn unreachable(error: &tokio_postgres::Error) -> bool {
    let mut source: Option<&(dyn std::error::Error + 'static)> = std::error::Error::source(error);
    while let Some(cause) = source {
        if let Some(io) = cause.downcast_ref::<std::io::Error>() {
            return matches!(
                io.kind(),
                ErrorKind::TimedOut
                    | ErrorKind::ConnectionRefused
                    | ErrorKind::HostUnreachable
                    | ErrorKind::NetworkUnreachable
            );
        }
        source = cause.source();
    }
    false
}

/// `config` once per host, each with that host alone (its port and address) and every other
/// setting the same.
fn single_hosts(config: &Config) -> Vec<Config> {
    let hosts = config.get_hosts();
    if hosts.len() <= 1 {
        return vec![config.clone()];
    }
    let (ports, addresses) = (config.get_ports(), config.get_hostaddrs());
    hosts
        .iter()
        .enumerate()
        .map(|(index, host)| {
            let mut single = Config::new();
            match host {
                Host::Tcp(name) => single.host(name),
                #[cfg(unix)]
                Host::Unix(path) => single.host_path(path),
            };
            // One port stands for every host; otherwise there is one per host.
            if let Some(port) = ports.get(index).or(ports.first()) {
                single.port(*port);
            }
            if let Some(address) = addresses.get(index) {
                single.hostaddr(*address);
            }
            copy_settings(config, &mut single);
            single
        })
        .collect()
}

/// Every setting of `from` but its hosts, ports and addresses.
fn copy_settings(from: &Config, to: &mut Config) {
    if let Some(user) = from.get_user() {
        to.user(user);
    }
    if let Some(password) = from.get_password() {
        to.password(password);
    }
    if let Some(dbname) = from.get_dbname() {
        to.dbname(dbname);
    }
    if let Some(options) = from.get_options() {
        to.options(options);
    }
    if let Some(name) = from.get_application_name() {
        to.application_name(name);
    }
    if let Some(timeout) = from.get_connect_timeout() {
        to.connect_timeout(*timeout);
    }
    if let Some(timeout) = from.get_tcp_user_timeout() {
        to.tcp_user_timeout(*timeout);
    }
    to.ssl_mode(from.get_ssl_mode())
        .ssl_negotiation(from.get_ssl_negotiation())
        .keepalives(from.get_keepalives())
        .keepalives_idle(from.get_keepalives_idle())
        .target_session_attrs(from.get_target_session_attrs())
        .channel_binding(from.get_channel_binding());
    if let Some(interval) = from.get_keepalives_interval() {
        to.keepalives_interval(interval);
    }
    if let Some(retries) = from.get_keepalives_retries() {
        to.keepalives_retries(retries);
    }
}

#[cfg(test)]
mod tests {
    use std::str::FromStr;

    use super::*;

    #[test]
    fn given_a_host_that_failed_to_accept_just_now_when_ordered_then_it_is_left_out_until_its_time_is_up() {
        let now = Instant::now();
        assert_eq!(order(&[None, None], now), vec![0, 1], "the URL's order");
        assert_eq!(order(&[Some(now), None], now), vec![1]);
        let earlier = now.checked_sub(DOWN_FOR).expect("an instant");
        assert_eq!(order(&[Some(earlier), None], now), vec![0, 1], "tried again once its time is up");
    }

    #[test]
    fn given_every_host_failed_just_now_when_ordered_then_all_are_tried_again() {
        let now = Instant::now();
        assert_eq!(order(&[Some(now), Some(now)], now), vec![0, 1]);
    }

    /// A loopback port where nothing listens (its connection is refused at once).
    fn closed_port() -> u16 {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("a port");
        listener.local_addr().expect("its address").port()
    }

    #[tokio::test]
    async fn given_a_host_that_refuses_and_one_that_answers_when_connected_then_only_the_refusing_one_is_left_out() {
        // The second host accepts the socket and closes it: a server that answered (and failed
        // the startup), not an unreachable one.
        let answering = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("a port");
        let answering_port = answering.local_addr().expect("its address").port();
        let accepted = tokio::spawn(async move {
            let mut count = 0;
            while let Ok(Ok((socket, _))) = tokio::time::timeout(Duration::from_secs(5), answering.accept()).await {
                drop(socket);
                count += 1;
                if count == 2 {
                    break;
                }
            }
            count
        });
        let config = Config::from_str(&format!(
            "host=127.0.0.1,127.0.0.1 port={},{answering_port} user=app connect_timeout=2",
            closed_port()
        ))
        .expect("parsed");
        let hosts = Hosts::new(&config);
        assert!(hosts.connect().await.is_err(), "neither host gives a connection");
        let failed_at = hosts.failed_at.lock().expect("not poisoned").clone();
        assert!(failed_at[0].is_some(), "the refusing host is left out");
        assert!(failed_at[1].is_none(), "the answering host is not");
        assert!(hosts.connect().await.is_err());
        assert_eq!(accepted.await.expect("the listener"), 2, "each connect reached the answering host");
        assert_eq!(order(&hosts.failed_at.lock().expect("not poisoned"), Instant::now()), vec![1]);
    }

    #[tokio::test]
    async fn given_a_single_host_that_refuses_when_connected_then_it_is_never_left_out() {
        let config = Config::from_str(&format!("host=127.0.0.1 port={} user=app", closed_port())).expect("parsed");
        let hosts = Hosts::new(&config);
        assert!(hosts.connect().await.is_err());
        assert_eq!(hosts.failed_at.lock().expect("not poisoned").as_slice(), &[None]);
    }

    #[test]
    fn given_a_url_of_two_hosts_when_split_then_each_keeps_its_own_port_and_every_other_setting() {
        let config = Config::from_str(
            "host=a,b port=5432,5433 user=app password=secret dbname=platform target_session_attrs=read-write \
             connect_timeout=2 tcp_user_timeout=4 application_name=svc",
        )
        .expect("parsed");
        let each = single_hosts(&config);
        assert_eq!(each.len(), 2);
        for (single, (host, port)) in each.iter().zip([("a", 5432), ("b", 5433)]) {
            assert_eq!(single.get_hosts(), &[Host::Tcp(host.to_owned())]);
            assert_eq!(single.get_ports(), &[port]);
            assert_eq!(single.get_user(), Some("app"));
            assert_eq!(single.get_password(), Some(&b"secret"[..]));
            assert_eq!(single.get_dbname(), Some("platform"));
            assert_eq!(single.get_application_name(), Some("svc"));
            assert_eq!(single.get_connect_timeout(), Some(&Duration::from_secs(2)));
            assert_eq!(single.get_tcp_user_timeout(), Some(&Duration::from_secs(4)));
            assert_eq!(single.get_target_session_attrs(), tokio_postgres::config::TargetSessionAttrs::ReadWrite);
        }
        let one_port = single_hosts(&Config::from_str("host=a,b port=6000 user=app").expect("parsed"));
        assert_eq!(one_port.iter().map(|single| single.get_ports().to_vec()).collect::<Vec<_>>(), [[6000], [6000]]);
    }
}
