//! The standard parts of the admin API, each a [`Router`] for
//! [`crate::compose`].

use crate::server::json_error;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Path, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use prometheus_client::registry::Registry;
use serde::Serialize;
use std::sync::Arc;

/// `GET /metrics`: the registry as OpenMetrics text.
pub fn metrics(registry: Arc<Registry>) -> Router {
    Router::new()
        .route("/metrics", get(serve_metrics))
        .with_state(registry)
}

async fn serve_metrics(State(reg): State<Arc<Registry>>) -> Response {
    match crate::metrics::encode(&reg) {
        Ok(text) => (
            [(
                header::CONTENT_TYPE,
                HeaderValue::from_static(crate::metrics::CONTENT_TYPE),
            )],
            text,
        )
            .into_response(),
        Err(_) => json_error(StatusCode::INTERNAL_SERVER_ERROR, "metrics encoding failed"),
    }
}

/// `GET path`: the JSON of whatever `f` returns at request time.
pub fn get_json<T, F>(path: &str, f: F) -> Router
where
    T: Serialize,
    F: Fn() -> T + Clone + Send + Sync + 'static,
{
    Router::new().route(path, get(move || async move { json_ok(&f()) }))
}

/// `POST path`: runs `f` off the async runtime (it may block: a
/// configuration reload opens files and volumes) and answers `200` with
/// the JSON it returns, or `409` with its error (the action changed
/// nothing). A body, if any, is ignored.
pub fn post_action<F>(path: &str, f: F) -> Router
where
    F: Fn() -> Result<serde_json::Value, String> + Clone + Send + Sync + 'static,
{
    Router::new().route(
        path,
        axum::routing::post(move || {
            let f = f.clone();
            async move {
                match tokio::task::spawn_blocking(f).await {
                    Ok(Ok(v)) => json_ok(&v),
                    Ok(Err(e)) => json_error(StatusCode::CONFLICT, &e),
                    Err(e) => json_error(
                        StatusCode::INTERNAL_SERVER_ERROR,
                        &format!("the action did not finish: {e}"),
                    ),
                }
            }
        }),
    )
}

pub(crate) fn json_ok<T: Serialize + ?Sized>(v: &T) -> Response {
    match serde_json::to_string_pretty(v) {
        Ok(s) => (
            [(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            )],
            s + "\n",
        )
            .into_response(),
        Err(e) => json_error(
            StatusCode::INTERNAL_SERVER_ERROR,
            &format!("JSON encoding failed: {e}"),
        ),
    }
}

/// A rejected tenant update (the running table is unchanged).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum TenantUpdateError {
    /// Update of a tenant that does not exist (404).
    #[error("unknown tenant `{0}`")]
    Unknown(String),
    /// Bad JSON or a value refused; the message names the key (400).
    #[error("{0}")]
    Invalid(String),
}

/// What the tenant table API needs from its owner (the target).
pub trait TenantApi: Send + Sync + 'static {
    /// The running table (a JSON array of tenant specs).
    fn list(&self) -> serde_json::Value;
    /// One tenant's spec.
    fn get(&self, name: &str) -> Option<serde_json::Value>;
    /// Applies a JSON update of tenant `name`; `create` allows a new
    /// tenant (`PUT`), otherwise the tenant must exist (`POST`). Returns
    /// the tenant's new spec.
    fn update(
        &self,
        name: &str,
        body: &str,
        create: bool,
    ) -> Result<serde_json::Value, TenantUpdateError>;
    /// Deletes tenant `name` (`DELETE`): `Unknown` if there is none,
    /// `Invalid` if it may not be deleted (the default tenant, say).
    fn delete(&self, name: &str) -> Result<(), TenantUpdateError>;
}

type Api = Arc<dyn TenantApi>;

/// The tenant table: `GET /v1/tenants`, `GET /v1/tenants/{name}`,
/// `PUT|POST|DELETE /v1/tenants/{name}`, and the pre-v1 paths `GET
/// /tenants`, `PUT|POST|DELETE /tenants/{name}` with the same behaviour.
pub fn tenants(api: Api) -> Router {
    Router::new()
        .route("/v1/tenants", get(list))
        .route("/tenants", get(list))
        .route(
            "/v1/tenants/{name}",
            get(one).put(put).post(post).delete(delete),
        )
        .route(
            "/tenants/{name}",
            axum::routing::put(put).post(post).delete(delete),
        )
        .with_state(api)
}

/// `204` once deleted, `404` for an unknown tenant, `400` for one that may
/// not be deleted.
async fn delete(State(api): State<Api>, Path(name): Path<String>) -> Response {
    match api.delete(&name) {
        Ok(()) => StatusCode::NO_CONTENT.into_response(),
        Err(e @ TenantUpdateError::Unknown(_)) => json_error(StatusCode::NOT_FOUND, &e.to_string()),
        Err(e) => json_error(StatusCode::BAD_REQUEST, &e.to_string()),
    }
}

async fn list(State(api): State<Api>) -> Response {
    json_ok(&api.list())
}

async fn one(State(api): State<Api>, Path(name): Path<String>) -> Response {
    match api.get(&name) {
        Some(v) => json_ok(&v),
        None => json_error(StatusCode::NOT_FOUND, &format!("unknown tenant `{name}`")),
    }
}

async fn put(
    State(api): State<Api>,
    Path(name): Path<String>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    update(api, name, body, true)
}

async fn post(
    State(api): State<Api>,
    Path(name): Path<String>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    update(api, name, body, false)
}

fn update(api: Api, name: String, body: Result<Bytes, BytesRejection>, create: bool) -> Response {
    let body = match body {
        Ok(b) => b,
        Err(e) => {
            let status = e.status();
            let msg = if status == StatusCode::PAYLOAD_TOO_LARGE {
                "body too large".to_string()
            } else {
                e.body_text()
            };
            return json_error(status, &msg);
        }
    };
    let Ok(body) = std::str::from_utf8(&body) else {
        return json_error(StatusCode::BAD_REQUEST, "bad tenant JSON: not UTF-8");
    };
    match api.update(&name, body, create) {
        Ok(v) => json_ok(&v),
        Err(e @ TenantUpdateError::Unknown(_)) => json_error(StatusCode::NOT_FOUND, &e.to_string()),
        Err(e) => json_error(StatusCode::BAD_REQUEST, &e.to_string()),
    }
}
