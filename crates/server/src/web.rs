//! The web page at `/`: hand-written HTML, CSS and JavaScript (no build step), embedded in the
//! binary so the page works offline, served with an ETag and a strict Content-Security-Policy
//! (scripts and styles from this origin only, no inline script, nothing from elsewhere).

use std::sync::OnceLock;

use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};

use crate::error::ApiError;
use crate::extract::Path;

/// Everything the page loads comes from here; images are the PNGs the API returns inline
/// (`data:`) or files fetched with the API key (`blob:`). HTML that code produced (pandas
/// tables) is rebuilt element by element from an allow-list, never assigned as markup.
const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; \
img-src 'self' data: blob:; connect-src 'self'; manifest-src 'self'; base-uri 'none'; \
form-action 'none'; frame-ancestors 'none'";

struct Asset {
    name: &'static str,
    content_type: &'static str,
    body: &'static [u8],
}

const INDEX: Asset = Asset {
    name: "index.html",
    content_type: "text/html; charset=utf-8",
    body: include_bytes!("../web/index.html"),
};

/// Served under `/assets/{name}`.
const ASSETS: &[Asset] = &[
    Asset {
        name: "app.js",
        content_type: "text/javascript; charset=utf-8",
        body: include_bytes!("../web/app.js"),
    },
    Asset {
        name: "api.js",
        content_type: "text/javascript; charset=utf-8",
        body: include_bytes!("../web/api.js"),
    },
    Asset {
        name: "editor.js",
        content_type: "text/javascript; charset=utf-8",
        body: include_bytes!("../web/editor.js"),
    },
    Asset {
        name: "render.js",
        content_type: "text/javascript; charset=utf-8",
        body: include_bytes!("../web/render.js"),
    },
    Asset {
        name: "app.css",
        content_type: "text/css; charset=utf-8",
        body: include_bytes!("../web/app.css"),
    },
    Asset {
        name: "icon.svg",
        content_type: "image/svg+xml",
        body: include_bytes!("../web/icon.svg"),
    },
];

/// The body's SHA-256, shortened: computed once per asset per process.
fn etag(asset: &Asset) -> &'static str {
    static TAGS: OnceLock<Vec<(&'static str, String)>> = OnceLock::new();
    let tags = TAGS.get_or_init(|| {
        use sha2::Digest;
        std::iter::once(&INDEX)
            .chain(ASSETS)
            .map(|a| {
                let d = sha2::Sha256::digest(a.body);
                let hex: String = d[..12].iter().map(|b| format!("{b:02x}")).collect();
                (a.name, format!("\"{hex}\""))
            })
            .collect()
    });
    tags.iter()
        .find(|(n, _)| *n == asset.name)
        .map_or("\"\"", |(_, t)| t.as_str())
}

fn respond(asset: &Asset, headers: &HeaderMap) -> Response {
    let tag = etag(asset);
    let fresh = headers
        .get(header::IF_NONE_MATCH)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.split(',').any(|t| t.trim() == tag));
    let common = [
        (header::ETAG, HeaderValue::from_static(tag)),
        // Small files: always revalidate, so a new binary's page is never mixed with old parts.
        (header::CACHE_CONTROL, HeaderValue::from_static("no-cache")),
        (
            header::CONTENT_SECURITY_POLICY,
            HeaderValue::from_static(CSP),
        ),
        (
            header::X_CONTENT_TYPE_OPTIONS,
            HeaderValue::from_static("nosniff"),
        ),
        (
            header::REFERRER_POLICY,
            HeaderValue::from_static("no-referrer"),
        ),
    ];
    if fresh {
        return (StatusCode::NOT_MODIFIED, common).into_response();
    }
    (
        common,
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static(asset.content_type),
        )],
        asset.body,
    )
        .into_response()
}

/// `GET /`: the page (its views are chosen by the URL's fragment).
pub async fn index(headers: HeaderMap) -> Response {
    respond(&INDEX, &headers)
}

/// `GET /assets/{name}`.
pub async fn asset(Path(name): Path<String>, headers: HeaderMap) -> Response {
    match ASSETS.iter().find(|a| a.name == name) {
        Some(a) => respond(a, &headers),
        None => ApiError::not_found(format!("asset {name}")).into_response(),
    }
}
