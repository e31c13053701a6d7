//! Prometheus metrics and health endpoints.
//!
//! `GET /metrics` (Prometheus text exposition format 0.0.4), `GET /healthz` (the agent is alive),
//! `GET /readyz` (the datapath is attached and a config is in force). HTTP is hyper's, on the
//! agent's own runtime; the families are modelled with prometheus-client and every value is read
//! when a scrape asks for it: the agent's status and the pinned datapath maps ([`families`]),
//! and `/proc/self` ([`process`]).

mod families;
mod process;

use std::{convert::Infallible, fmt, net::SocketAddr, path::PathBuf, sync::Arc, time::Duration};

use http_body_util::Full;
use hyper::{
    Method, Request, Response, StatusCode,
    body::Bytes,
    header::{CONTENT_TYPE, HeaderValue},
    server::conn::http1,
    service::service_fn,
};
use hyper_util::rt::TokioIo;
use prometheus_client::{
    encoding::{
        DescriptorEncoder, EncodeCounterValue, EncodeGaugeValue, EncodeLabelSet, EncodeMetric,
    },
    metrics::{MetricType, counter::ConstCounter, gauge::ConstGauge},
    registry::Registry,
};
use tokio::{net::TcpListener, task::JoinHandle};

use self::{families::AgentCollector, process::ProcessCollector};
use super::status::{AgentStatus, SharedStatus};
use crate::{causes::WithCauses, datapath::snapshot::DatapathCounts};

/// How long one connection may take, request and response together: a slow or stuck client
/// must not hold a task (and a file descriptor) for ever.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// The content type of the classic Prometheus text format, which is what `/metrics` serves.
const EXPOSITION_CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// The running server; stops when dropped.
#[derive(Debug)]
pub struct MetricsServer {
    task: JoinHandle<()>,
    /// The address actually bound (useful with port 0).
    pub local_addr: SocketAddr,
}

impl Drop for MetricsServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// What every request handler shares.
#[derive(Debug)]
struct Endpoint {
    status: SharedStatus,
    registry: Registry,
}

/// How long a port another process still holds is retried before the bind fails.
const BIND_RETRY_FOR: Duration = Duration::from_secs(3);

/// Binds `addr`, retrying for a moment while it is in use: the agent this one replaces may
/// still be letting go of it (a killed process whose forked child has not reached `exec` yet
/// holds a copy of the socket).
async fn bind(addr: SocketAddr) -> std::io::Result<TcpListener> {
    let deadline = tokio::time::Instant::now() + BIND_RETRY_FOR;
    loop {
        match TcpListener::bind(addr).await {
            Err(error)
                if error.kind() == std::io::ErrorKind::AddrInUse
                    && tokio::time::Instant::now() < deadline =>
            {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            result => return result,
        }
    }
}

/// Binds `addr` and serves until the returned handle is dropped.
///
/// The socket is bound before this returns, so a bind error comes back here and not later.
pub async fn serve(
    addr: SocketAddr,
    status: SharedStatus,
    pin_path: Option<PathBuf>,
) -> std::io::Result<MetricsServer> {
    let listener = bind(addr).await?;
    let local_addr = listener.local_addr()?;
    tracing::info!(%local_addr, "serving /metrics, /healthz and /readyz");
    let endpoint = Arc::new(Endpoint {
        registry: registry(AgentCollector::Live {
            status: status.clone(),
            pin_path,
        }),
        status,
    });
    let task = tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                continue;
            };
            let endpoint = Arc::clone(&endpoint);
            tokio::spawn(async move {
                let service = service_fn(move |request| {
                    let endpoint = Arc::clone(&endpoint);
                    async move { Ok::<_, Infallible>(respond(&endpoint, &request).await) }
                });
                // One request per connection, as scrapers and probes use them: no idle
                // keep-alive connections to bound.
                let connection = http1::Builder::new()
                    .keep_alive(false)
                    .serve_connection(TokioIo::new(stream), service);
                match tokio::time::timeout(REQUEST_TIMEOUT, connection).await {
                    Ok(Ok(())) => {}
                    Ok(Err(error)) => {
                        tracing::debug!(error = %WithCauses(&error), "metrics connection failed");
                    }
                    Err(error) => {
                        tracing::debug!(error = %WithCauses(&error), "metrics request timed out");
                    }
                }
            });
        }
    });
    Ok(MetricsServer { task, local_addr })
}

fn text(code: StatusCode, content_type: &'static str, body: String) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from(body)));
    *response.status_mut() = code;
    response
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    response
}

async fn respond<B>(endpoint: &Arc<Endpoint>, request: &Request<B>) -> Response<Full<Bytes>> {
    if request.method() != Method::GET {
        return text(
            StatusCode::METHOD_NOT_ALLOWED,
            "text/plain",
            "method not allowed\n".to_owned(),
        );
    }
    match request.uri().path() {
        "/metrics" => {
            // Reading the pinned maps is a run of bpf syscalls: keep it off the runtime's thread.
            let scrape = Arc::clone(endpoint);
            match tokio::task::spawn_blocking(move || encode(&scrape.registry)).await {
                Ok(Ok(page)) => text(StatusCode::OK, EXPOSITION_CONTENT_TYPE, page),
                Ok(Err(fmt::Error)) => text(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "text/plain",
                    "rendering failed\n".to_owned(),
                ),
                Err(error) => text(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "text/plain",
                    format!("rendering failed: {error}\n"),
                ),
            }
        }
        "/healthz" => text(StatusCode::OK, "text/plain", "ok\n".to_owned()),
        "/readyz" => {
            let status = endpoint.status.lock();
            if status.ready {
                text(StatusCode::OK, "text/plain", "ready\n".to_owned())
            } else {
                let reason = status.not_ready_reason.as_deref().unwrap_or("starting");
                text(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "text/plain",
                    format!("not ready: {reason}\n"),
                )
            }
        }
        _ => text(
            StatusCode::NOT_FOUND,
            "text/plain",
            "not found\n".to_owned(),
        ),
    }
}

/// The registry `/metrics` serves: the agent's families, then the process's.
fn registry(agent: AgentCollector) -> Registry {
    let mut registry = Registry::default();
    registry.register_collector(Box::new(agent));
    registry.register_collector(Box::new(ProcessCollector));
    registry
}

/// Encodes `registry` in the classic Prometheus text format.
fn encode(registry: &Registry) -> Result<String, fmt::Error> {
    let mut openmetrics = String::with_capacity(8 * 1024);
    prometheus_client::encoding::text::encode_registry(&mut openmetrics, registry)?;
    Ok(to_prometheus_text(&openmetrics))
}

/// Turns prometheus-client's OpenMetrics text into the classic 0.0.4 text format.
///
/// The two differ in what this agent emits only in counter family names (OpenMetrics names the
/// family without `_total`, the classic format names it as its sample, which is what dashboards
/// and the 0.0.4 parser match) and in the `# EOF` trailer the classic format does not have.
fn to_prometheus_text(openmetrics: &str) -> String {
    let counters: std::collections::HashSet<&str> = openmetrics
        .lines()
        .filter_map(|line| line.strip_prefix("# TYPE ")?.strip_suffix(" counter"))
        .collect();
    let mut out = String::with_capacity(openmetrics.len() + 256);
    for line in openmetrics.lines() {
        if line == "# EOF" {
            continue;
        }
        let comment = ["# HELP ", "# TYPE "]
            .into_iter()
            .find(|prefix| line.starts_with(prefix));
        if let Some(prefix) = comment {
            let rest = &line[prefix.len()..];
            let name = rest.split(' ').next().unwrap_or_default();
            if counters.contains(name) {
                out.push_str(prefix);
                out.push_str(name);
                out.push_str("_total");
                out.push_str(&rest[name.len()..]);
                out.push('\n');
                continue;
            }
        }
        out.push_str(line);
        out.push('\n');
    }
    out
}

/// The page `/metrics` would serve for `status` and the datapath's `counts` (`None`: the maps
/// could not be read), process metrics included.
pub fn render(status: &AgentStatus, counts: Option<&DatapathCounts>) -> String {
    let registry = registry(AgentCollector::Fixed(Box::new((
        status.clone(),
        counts.cloned(),
    ))));
    // Writing to a String cannot fail, and every value is encodable.
    encode(&registry).unwrap_or_else(|fmt::Error| String::new())
}

/// A family of one or more series of `metric`.
fn family<L: EncodeLabelSet, M: EncodeMetric>(
    encoder: &mut DescriptorEncoder<'_>,
    name: &str,
    help: &str,
    metric_type: MetricType,
    series: impl IntoIterator<Item = (L, M)>,
) -> fmt::Result {
    let mut family = encoder.encode_descriptor(name, help, None, metric_type)?;
    for (labels, metric) in series {
        metric.encode(family.encode_family(&labels)?)?;
    }
    Ok(())
}

/// A gauge family without labels.
fn gauge(
    encoder: &mut DescriptorEncoder<'_>,
    name: &str,
    help: &str,
    value: impl EncodeGaugeValue,
) -> fmt::Result {
    // Straight on the family's encoder: a labelled series with no labels would read `name{}`.
    ConstGauge::new(value).encode(encoder.encode_descriptor(name, help, None, MetricType::Gauge)?)
}

/// A counter family without labels; `name` is without the `_total` the encoding appends.
fn counter(
    encoder: &mut DescriptorEncoder<'_>,
    name: &str,
    help: &str,
    value: impl EncodeCounterValue,
) -> fmt::Result {
    // Straight on the family's encoder: a labelled series with no labels would read `name{}`.
    ConstCounter::new(value).encode(encoder.encode_descriptor(
        name,
        help,
        None,
        MetricType::Counter,
    )?)
}

/// Gauge series of `series`' values under their labels.
fn gauges<L: EncodeLabelSet, V: EncodeGaugeValue>(
    series: impl IntoIterator<Item = (L, V)>,
) -> impl Iterator<Item = (L, ConstGauge<V>)> {
    series
        .into_iter()
        .map(|(labels, value)| (labels, ConstGauge::new(value)))
}

/// Counter series of `series`' values under their labels.
fn counters<L: EncodeLabelSet, V: EncodeCounterValue>(
    series: impl IntoIterator<Item = (L, V)>,
) -> impl Iterator<Item = (L, ConstCounter<V>)> {
    series
        .into_iter()
        .map(|(labels, value)| (labels, ConstCounter::new(value)))
}

#[cfg(test)]
mod tests {
    use std::time::{SystemTime, UNIX_EPOCH};

    use super::{families::tests::representative, *};

    /// The value of `series` (name and labels, exactly) on `page`.
    pub(super) fn sample(page: &str, series: &str) -> Option<f64> {
        page.lines()
            .filter(|line| !line.starts_with('#'))
            .find_map(|line| line.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
    }

    /// The value of histogram `name`'s bucket bounded by `bound` on `page`, however the bound
    /// is written (`2`, `2.0`).
    pub(super) fn bucket(page: &str, name: &str, bound: f64) -> Option<f64> {
        let prefix = format!("{name}_bucket{{le=\"");
        page.lines().find_map(|line| {
            let (written, value) = line.strip_prefix(&prefix)?.split_once("\"} ")?;
            (written.parse::<f64>().ok()? == bound).then(|| value.parse().ok())?
        })
    }

    #[test]
    fn the_page_is_the_classic_text_format() {
        let (status, counts) = representative();
        let page = render(&status, Some(&counts));
        assert!(!page.contains("# EOF"), "{page}");
        assert!(!page.contains("# UNIT"), "{page}");
        assert!(
            page.contains("# TYPE masq_datapath_packets_total counter\n"),
            "{page}"
        );
        assert!(page.contains("# HELP process_cpu_seconds_total "), "{page}");
        assert_eq!(
            sample(&page, r#"masq_uplink_address_local{interface="up0"}"#),
            Some(0.0),
            "{page}"
        );
        assert_eq!(
            bucket(&page, "masq_port_allocation_attempts", 32.0),
            Some(6.0),
            "{page}"
        );
        let start = sample(&page, "process_start_time_seconds").unwrap_or_default();
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default()
            .as_secs_f64();
        assert!(start > 1e9 && start <= now + 1.0, "{page}");
        assert!(
            sample(&page, "process_resident_memory_bytes").unwrap_or_default() > 0.0,
            "{page}"
        );
        assert!(
            sample(&page, "process_open_fds").unwrap_or_default() >= 1.0,
            "{page}"
        );
    }

    #[test]
    fn only_counter_names_and_the_trailer_differ_from_openmetrics() {
        let openmetrics = "# HELP a_seconds A counter.\n# TYPE a_seconds counter\na_seconds_total 1\n\
             # HELP b A gauge named like a counter.\n# TYPE b gauge\nb 2.5\n\
             # TYPE h histogram\nh_sum 1.5\nh_count 1\nh_bucket{le=\"0.5\"} 0\n\
             h_bucket{le=\"1.0\"} 1\nh_bucket{le=\"+Inf\"} 1\n# EOF\n";
        assert_eq!(
            to_prometheus_text(openmetrics),
            "# HELP a_seconds_total A counter.\n# TYPE a_seconds_total counter\na_seconds_total 1\n\
             # HELP b A gauge named like a counter.\n# TYPE b gauge\nb 2.5\n\
             # TYPE h histogram\nh_sum 1.5\nh_count 1\nh_bucket{le=\"0.5\"} 0\n\
             h_bucket{le=\"1.0\"} 1\nh_bucket{le=\"+Inf\"} 1\n"
        );
    }

    /// Sends one raw HTTP/1.1 request and returns the status line and body.
    async fn request(addr: SocketAddr, method: &str, path: &str) -> (String, String) {
        use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
        let mut stream = tokio::net::TcpStream::connect(addr)
            .await
            .unwrap_or_else(|error| {
                panic!("connecting to {addr}: {error}");
            });
        let head = format!("{method} {path} HTTP/1.1\r\nHost: masq\r\n\r\n");
        stream
            .write_all(head.as_bytes())
            .await
            .unwrap_or_else(|error| panic!("sending: {error}"));
        let mut response = String::new();
        stream
            .read_to_string(&mut response)
            .await
            .unwrap_or_else(|error| panic!("reading: {error}"));
        let (head, body) = response.split_once("\r\n\r\n").unwrap_or((&response, ""));
        let status = head.lines().next().unwrap_or_default().to_owned();
        (status, body.to_owned())
    }

    #[tokio::test]
    async fn endpoints_answer_by_path_and_method() {
        let status = SharedStatus::default();
        status.lock().not_ready_reason = Some("no uplink yet".to_owned());
        let server = serve(SocketAddr::from(([127, 0, 0, 1], 0)), status.clone(), None)
            .await
            .unwrap_or_else(|error| panic!("binding: {error}"));
        let addr = server.local_addr;

        let (code, body) = request(addr, "GET", "/metrics").await;
        assert_eq!(code, "HTTP/1.1 200 OK");
        assert!(body.contains("masq_ready 0\n"), "{body}");
        assert!(body.contains("# TYPE process_open_fds gauge\n"), "{body}");
        assert_eq!(request(addr, "GET", "/healthz").await.1, "ok\n");
        assert_eq!(
            request(addr, "GET", "/readyz").await,
            (
                "HTTP/1.1 503 Service Unavailable".to_owned(),
                "not ready: no uplink yet\n".to_owned()
            )
        );
        status.lock().ready = true;
        assert_eq!(
            request(addr, "GET", "/readyz?verbose").await,
            ("HTTP/1.1 200 OK".to_owned(), "ready\n".to_owned())
        );
        assert_eq!(
            request(addr, "GET", "/nothing").await.0,
            "HTTP/1.1 404 Not Found"
        );
        assert_eq!(
            request(addr, "POST", "/metrics").await.0,
            "HTTP/1.1 405 Method Not Allowed"
        );

        // A second bind of the same address fails in `serve` itself.
        assert!(serve(addr, status, None).await.is_err());
    }
}
