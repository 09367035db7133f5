//! Runs one benchmark point: warm-ups, then every request sent at its scheduled arrival time,
//! at most `max_concurrency` in flight, each measured by [`send_request`].

use std::sync::Arc;
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressStyle};
use rand::rngs::StdRng;
use rand::SeedableRng;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::client::{send_request, EndpointConfig, RequestInput, RequestOutcome};
use crate::error::BenchError;
use crate::report::python_float;
use crate::schedule::arrival_offsets;

/// Traffic shape of one run.
#[derive(Debug, Clone)]
pub struct RunSettings {
    pub request_rate: f64,
    pub burstiness: f64,
    pub max_concurrency: Option<usize>,
    pub num_warmups: usize,
    pub show_progress: bool,
    /// Seeds the arrival schedule.
    pub seed: u64,
}

/// The raw result of one run: an outcome per request, in input order, and the wall time.
#[derive(Debug, Clone)]
pub struct RunOutcome {
    pub outcomes: Vec<RequestOutcome>,
    pub duration_s: f64,
}

fn progress_bar(total: usize, visible: bool) -> ProgressBar {
    if !visible {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::new(total as u64);
    if let Ok(style) = ProgressStyle::with_template(
        "{percent:>3}%|{wide_bar}| {pos}/{len} [{elapsed_precise}<{eta_precise}, {per_sec}]",
    ) {
        bar.set_style(style);
    }
    bar
}

async fn join_all(
    handles: Vec<tokio::task::JoinHandle<RequestOutcome>>,
) -> Result<Vec<RequestOutcome>, BenchError> {
    let mut outcomes = Vec::with_capacity(handles.len());
    for handle in handles {
        outcomes.push(
            handle
                .await
                .map_err(|err| BenchError::Task(err.to_string()))?,
        );
    }
    Ok(outcomes)
}

/// Runs `requests` against the endpoint with the given traffic shape.
pub async fn run_benchmark(
    http: &reqwest::Client,
    endpoint: &Arc<EndpointConfig>,
    settings: &RunSettings,
    requests: &[RequestInput],
) -> Result<RunOutcome, BenchError> {
    let semaphore = settings
        .max_concurrency
        .map(|limit| Arc::new(Semaphore::new(limit)));

    if settings.num_warmups > 0 {
        if let Some(first) = requests.first() {
            println!("Warming up with {} requests...", settings.num_warmups);
            let bar = progress_bar(settings.num_warmups, settings.show_progress);
            let warmup_start = Instant::now();
            let mut handles = Vec::with_capacity(settings.num_warmups);
            for _ in 0..settings.num_warmups {
                let permit = acquire(&semaphore).await;
                handles.push(spawn_request(
                    http,
                    endpoint,
                    permit,
                    first.clone(),
                    warmup_start,
                    0.0,
                    &bar,
                ));
            }
            join_all(handles).await?;
            bar.finish_and_clear();
            println!("Warmup run completed.");
        }
    }

    println!("Starting main benchmark run...");
    let distribution = if settings.burstiness == 1.0 {
        "Poisson process"
    } else {
        "Gamma distribution"
    };
    println!(
        "Traffic request rate: {}",
        python_float(settings.request_rate)
    );
    println!(
        "Burstiness factor: {} ({distribution})",
        python_float(settings.burstiness)
    );
    match settings.max_concurrency {
        Some(limit) => println!("Maximum request concurrency: {limit}"),
        None => println!("Maximum request concurrency: None"),
    }

    let mut rng = StdRng::seed_from_u64(settings.seed);
    let offsets = arrival_offsets(
        requests.len(),
        settings.request_rate,
        settings.burstiness,
        &mut rng,
    )?;
    let bar = progress_bar(requests.len(), settings.show_progress);
    let run_start = Instant::now();
    let mut handles = Vec::with_capacity(requests.len());
    for (request, offset) in requests.iter().zip(offsets) {
        if offset > 0.0 {
            tokio::time::sleep_until((run_start + Duration::from_secs_f64(offset)).into()).await;
        }
        // Taking the slot here, not inside the task, sends queued requests in dataset order.
        let permit = acquire(&semaphore).await;
        handles.push(spawn_request(
            http,
            endpoint,
            permit,
            request.clone(),
            run_start,
            offset,
            &bar,
        ));
    }
    let outcomes = join_all(handles).await?;
    let duration_s = run_start.elapsed().as_secs_f64();
    // The bar is cleared and its final count written as a line of its own, so the result
    // block (on stdout) never starts on the bar's line.
    if !bar.is_hidden() {
        bar.finish_and_clear();
        eprintln!("{} requests in {duration_s:.1} s", bar.position());
    }
    Ok(RunOutcome {
        outcomes,
        duration_s,
    })
}

/// Waits for a concurrency slot (none to wait for without a limit).
async fn acquire(semaphore: &Option<Arc<Semaphore>>) -> Option<OwnedSemaphorePermit> {
    // The semaphore is never closed, so acquiring cannot fail; if it ever did, the request
    // would run unthrottled rather than not at all.
    match semaphore {
        Some(semaphore) => Arc::clone(semaphore).acquire_owned().await.ok(),
        None => None,
    }
}

/// Sends one request in its own task, holding its concurrency slot until it completes.
/// `arrival` is its scheduled send time (seconds from `run_start`): time spent waiting for the
/// slot after it is client queueing.
fn spawn_request(
    http: &reqwest::Client,
    endpoint: &Arc<EndpointConfig>,
    permit: Option<OwnedSemaphorePermit>,
    request: RequestInput,
    run_start: Instant,
    arrival: f64,
    bar: &ProgressBar,
) -> tokio::task::JoinHandle<RequestOutcome> {
    let (http, endpoint, bar) = (http.clone(), Arc::clone(endpoint), bar.clone());
    tokio::spawn(async move {
        let mut outcome = send_request(&http, &endpoint, &request, run_start).await;
        drop(permit);
        outcome.client_queue_time = (outcome.start_time - arrival).max(0.0);
        bar.inc(1);
        outcome
    })
}
