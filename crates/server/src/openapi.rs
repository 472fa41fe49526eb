//! What the OpenAPI document says beyond each handler's declaration: the answers every
//! operation may get from the layers in front of it (the key check, the request parsing), the
//! security each operation needs, and the ranges this server's limit policy accepts.

use runcell_engine::LimitPolicy;
use utoipa::openapi::path::Operation;
use utoipa::openapi::schema::Object;
use utoipa::openapi::security::SecurityRequirement;
use utoipa::openapi::{ContentBuilder, OpenApi, Ref, RefOr, Response, ResponseBuilder, Schema};

/// Completes the document for a server with `limits`.
pub(crate) fn document(api: &mut OpenApi, limits: &LimitPolicy, batches: &crate::batches::Batches) {
    // Security is per operation: `/healthz` answers every probe.
    api.security = None;
    for (path, op) in operations(api) {
        let open = path == "/healthz";
        if !open {
            op.security = Some(vec![SecurityRequirement::new(
                "api_key",
                Vec::<String>::new(),
            )]);
            add(op, "401", UNAUTHORIZED);
        }
        // Every body and every parameter is parsed before the handler runs.
        if op.request_body.is_some() || op.parameters.as_ref().is_some_and(|p| !p.is_empty()) {
            add(op, "400", BAD_REQUEST);
        }
    }
    document_ranges(api, limits);
    document_batches(api, batches);
    document_tools(api);
    document_paths(api);
    document_start(api);
    for (path, op) in operations(api) {
        document_bytes(op);
        if path == "/v1/sessions/{id}/files" {
            document_upload(op);
        }
    }
}

/// `start: "zygote"` is for Python sessions and one-shot runs: one of another language starts
/// `cold` (or says nothing). The rule joins each request's schema as an `anyOf` of the two
/// cases, so a client (or a fuzzer) sees which combinations are refused.
fn document_start(api: &mut OpenApi) {
    use utoipa::openapi::schema::{AllOfBuilder, AnyOfBuilder, ObjectBuilder, SchemaType};
    let Some(components) = api.components.as_mut() else {
        return;
    };
    document_labels(components);
    for name in ["CreateSessionRequest", "ExecuteOnceRequest"] {
        let Some(request) = components.schemas.remove(name) else {
            continue;
        };
        let only = |field: &str, value: &str| {
            let choice = ObjectBuilder::new()
                .schema_type(SchemaType::AnyValue)
                .enum_values(Some([serde_json::json!(value), serde_json::Value::Null]))
                .build();
            ObjectBuilder::new()
                .schema_type(SchemaType::AnyValue)
                .property(field, choice)
                .build()
        };
        let python_or_cold = AnyOfBuilder::new()
            .item(only("language", "python"))
            .item(only("start", "cold"))
            .description(Some(
                "`start: \"zygote\"` only for Python (the default language)",
            ))
            .build();
        let all = AllOfBuilder::new()
            .item(request)
            .item(Schema::AnyOf(python_or_cold))
            .build();
        components
            .schemas
            .insert(name.to_owned(), RefOr::T(Schema::AllOf(all)));
    }
}

/// A name in a workspace path: not `.` or `..`, no `/` or NUL, at most 255 characters (the
/// kernel's NAME_MAX is 255 *bytes*: a name of wide characters can be refused below this).
const NAME: &str = r"(?!\.\.?(?:/|$))[^/\x00]{1,255}";

/// A name that can also travel in a multipart part's `Content-Disposition` header, where
/// control characters cannot be written — except CR, LF (which clients send percent-encoded,
/// as HTML's form encoding does: the name arrives as `%0A`, itself a fine name) and tab.
const HEADER_NAME: &str = r"(?!\.\.?(?:/|$))[^/\x00-\x08\x0b\x0c\x0e-\x1f\x7f]{1,255}";

/// A workspace path as `validate_relative` takes it: relative, names separated by one or more
/// `/`, `.` names allowed (and skipped), at least one real name, a `/` at the end allowed.
fn path_pattern() -> String {
    path_of(NAME)
}

fn path_of(name: &str) -> String {
    format!(r"^(?:\./+)*{name}(?:/+(?:\.|{name}))*/*$")
}

/// A directory to list or upload into: a path, or the workspace itself (``, `.`, `./`).
fn dir_pattern() -> String {
    format!(r"^(?:\.(?:/+\.)*/*)?$|{}", path_pattern())
}

/// The longest path, in characters (bytes can be up to four times as many).
const PATH_MAX_CHARS: usize = runcell_engine::MAX_PATH_CHARS;

/// Workspace paths (file routes' `{path}` and `?path=`, one-shot `files[].path`, multipart part
/// names) carry the rules the engine applies, so a generated client or a fuzzer knows them.
fn document_paths(api: &mut OpenApi) {
    use utoipa::openapi::path::ParameterIn;
    let with = |o: &mut Object, pattern: String| {
        o.pattern = Some(pattern);
        o.max_length = Some(PATH_MAX_CHARS);
    };
    for (path, op) in operations(api) {
        if !path.starts_with("/v1/sessions/{id}/files") {
            continue;
        }
        for p in op.parameters.iter_mut().flatten() {
            let RefOr::T(p) = p else { continue };
            if p.name != "path" {
                continue;
            }
            if let Some(RefOr::T(Schema::Object(o))) = p.schema.as_mut() {
                match p.parameter_in {
                    ParameterIn::Path => {
                        with(o, path_pattern());
                        // A path's `/`s travel in the URL as they are (the route takes the
                        // rest of it); the example says so, to clients and fuzzers alike.
                        o.examples = vec![serde_json::json!("data/report.csv")];
                    }
                    _ => with(o, dir_pattern()),
                }
            }
        }
    }
    if let Some(components) = api.components.as_mut() {
        if let Some(p) = property(components, "InputFileBody", "path") {
            with(p, path_pattern());
        }
    }
}

/// A session's `metadata` and `env` carry their bounds (bounds.rs) where a schema can state
/// them: counts, and a metadata key's and value's length in characters. The environment's
/// sizes (32 KiB a variable as `NAME=value`, 256 KiB in all, in bytes as Linux counts them)
/// have no JSON Schema keyword.
fn document_labels(components: &mut utoipa::openapi::Components) {
    use runcell_engine::{
        MAX_ENV_VARS, MAX_METADATA_KEYS, MAX_METADATA_KEY_CHARS, MAX_METADATA_VALUE_CHARS,
    };
    if let Some(m) = property(components, "CreateSessionRequest", "metadata") {
        m.max_properties = Some(MAX_METADATA_KEYS);
        if let Some(Schema::Object(names)) = m.property_names.as_deref_mut() {
            names.min_length = Some(1);
            names.max_length = Some(MAX_METADATA_KEY_CHARS);
        }
        if let Some(utoipa::openapi::schema::AdditionalProperties::RefOr(RefOr::T(
            Schema::Object(values),
        ))) = m.additional_properties.as_deref_mut()
        {
            values.max_length = Some(MAX_METADATA_VALUE_CHARS);
        }
    }
    if let Some(env) = property(components, "CreateSessionRequest", "env") {
        env.max_properties = Some(MAX_ENV_VARS);
    }
}

/// The multipart upload: parts of any name, each a file, at least one.
fn document_upload(op: &mut Operation) {
    use utoipa::openapi::schema::{
        AdditionalProperties, KnownFormat, ObjectBuilder, SchemaFormat, Type,
    };
    let Some(RefOr::T(body)) = op.request_body.as_mut() else {
        return;
    };
    let Some(RefOr::T(form)) = body.content.get_mut("multipart/form-data") else {
        return;
    };
    let file = ObjectBuilder::new()
        .schema_type(Type::String)
        .format(Some(SchemaFormat::KnownFormat(KnownFormat::Binary)))
        .build();
    let mut schema = ObjectBuilder::new()
        .schema_type(Type::Object)
        .additional_properties(Some(AdditionalProperties::RefOr(RefOr::T(Schema::Object(
            file,
        )))))
        .build();
    schema.min_properties = Some(1);
    body.required = Some(utoipa::openapi::Required::True);
    // A part's name is its path (below `?path=`).
    let mut name = ObjectBuilder::new().schema_type(Type::String).build();
    // A name cannot end in `\`: in a quoted header value that escapes the closing quote
    // (multer then finds no name at all).
    name.pattern = Some(format!(r"^(?![\s\S]*\\$){}", &path_of(HEADER_NAME)[1..]));
    name.max_length = Some(PATH_MAX_CHARS);
    schema.property_names = Some(Box::new(Schema::Object(name)));
    form.schema = Some(RefOr::T(Schema::Object(schema)));
}

/// Raw bytes (an upload, a download) are a binary string, not utoipa's array of integers;
/// an upload may be empty (an empty file).
fn document_bytes(op: &mut Operation) {
    use utoipa::openapi::schema::{KnownFormat, ObjectBuilder, SchemaFormat, Type};
    let binary = || {
        RefOr::T(Schema::Object(
            ObjectBuilder::new()
                .schema_type(Type::String)
                .format(Some(SchemaFormat::KnownFormat(KnownFormat::Binary)))
                .build(),
        ))
    };
    let raw = |media: &str| media == "application/octet-stream" || media == "*/*";
    if let Some(RefOr::T(body)) = op.request_body.as_mut() {
        if body.content.keys().any(|m| raw(m)) {
            body.required = Some(utoipa::openapi::Required::False);
        }
        for (media, c) in body.content.iter_mut() {
            if let (true, RefOr::T(c)) = (raw(media), c) {
                c.schema = Some(binary());
            }
        }
    }
    for reply in op.responses.responses.values_mut() {
        if let RefOr::T(reply) = reply {
            for (media, c) in reply.content.iter_mut() {
                if let (true, RefOr::T(c)) = (raw(media), c) {
                    c.schema = Some(binary());
                }
            }
        }
    }
}

const UNAUTHORIZED: &str = "`unauthorized`: no API key (`Authorization: Bearer KEY`), or one that \
is invalid or revoked; a loopback server on which no key was ever created serves without one";

const BAD_REQUEST: &str = "`invalid_request`: a body that is not what the operation takes \
(malformed JSON, a missing or wrong `Content-Type`, an unknown field) or a malformed parameter";

fn operations(api: &mut OpenApi) -> impl Iterator<Item = (String, &mut Operation)> {
    api.paths.paths.iter_mut().flat_map(|(path, item)| {
        [
            &mut item.get,
            &mut item.put,
            &mut item.post,
            &mut item.delete,
            &mut item.options,
            &mut item.head,
            &mut item.patch,
            &mut item.trace,
        ]
        .into_iter()
        .flatten()
        .map(move |op| (path.clone(), op))
    })
}

/// An error response in the envelope, unless the handler documents that status itself.
fn add(op: &mut Operation, status: &str, description: &str) {
    op.responses
        .responses
        .entry(status.to_owned())
        .or_insert_with(|| RefOr::T(error_response(description)));
}

pub(crate) fn error_response(description: &str) -> Response {
    ResponseBuilder::new()
        .description(description)
        .content(
            "application/json",
            ContentBuilder::new()
                .schema(Some(Ref::from_schema_name("ErrorBody")))
                .build(),
        )
        .build()
}

/// The least and the most each limit and time limit may be here (a request outside is a 400;
/// the maxima are this server's `serve --max-*`).
fn document_ranges(api: &mut OpenApi, limits: &LimitPolicy) {
    use utoipa::Number;
    let Some(components) = api.components.as_mut() else {
        return;
    };
    let number = |v: f64| {
        if v.fract() == 0.0 && v >= 0.0 && v <= usize::MAX as f64 {
            Number::UInt(v as usize)
        } else {
            Number::Float(v)
        }
    };
    for (name, min, max) in limits.ranges() {
        if let Some(p) = property(components, "LimitsRequest", name) {
            p.minimum = Some(number(min));
            p.maximum = Some(number(max));
        }
    }
    let max_timeout = limits.max.exec_timeout_s as f64;
    for schema in ["ExecuteRequest", "CommandRequest", "ExecuteOnceRequest"] {
        if let Some(p) = property(components, schema, "timeout_s") {
            p.minimum = None;
            p.exclusive_minimum = Some(Number::UInt(0));
            p.maximum = Some(number(max_timeout));
        }
    }
    if let Some(p) = property(components, "ExecuteRequest", "tool_timeout_s") {
        p.minimum = None;
        p.exclusive_minimum = Some(Number::UInt(0));
        p.maximum = Some(number(
            runcell_engine::bridge::MAX_CALL_TIMEOUT.as_secs_f64(),
        ));
    }
}

/// Client tools: at most [`runcell_engine::bridge::MAX_TOOLS`] declared, no two alike (names
/// must differ too, which a schema cannot say: `uniqueItems` catches the identical ones), and
/// a tool result carries exactly one of `output` and `error` (either may be `null`: a present
/// `null` output is a tool that returned null).
fn document_tools(api: &mut OpenApi) {
    use utoipa::openapi::schema::{AllOfBuilder, ObjectBuilder, OneOfBuilder, SchemaType};
    let Some(components) = api.components.as_mut() else {
        return;
    };
    if let Some(RefOr::T(Schema::Object(o))) = components.schemas.get_mut("ExecuteRequest") {
        if let Some(RefOr::T(Schema::Array(a))) = o.properties.get_mut("tools") {
            a.max_items = Some(runcell_engine::bridge::MAX_TOOLS);
            a.unique_items = true;
        }
    }
    let Some(result) = components.schemas.remove("ToolResult") else {
        return;
    };
    let with = |field: &str| {
        ObjectBuilder::new()
            .schema_type(SchemaType::AnyValue)
            .required(field)
            .build()
    };
    let one = OneOfBuilder::new()
        .item(with("output"))
        .item(with("error"))
        .description(Some("exactly one of `output` and `error`"))
        .build();
    let all = AllOfBuilder::new()
        .item(result)
        .item(Schema::OneOf(one))
        .build();
    components
        .schemas
        .insert("ToolResult".to_owned(), RefOr::T(Schema::AllOf(all)));
}

/// This server's batch bounds: runs a batch, tests a run.
fn document_batches(api: &mut OpenApi, batches: &crate::batches::Batches) {
    let Some(components) = api.components.as_mut() else {
        return;
    };
    for (schema, field, max) in [
        ("BatchRequest", "runs", batches.max_runs),
        ("ExecuteOnceRequest", "tests", batches.max_tests_per_run),
    ] {
        let Some(RefOr::T(Schema::Object(o))) = components.schemas.get_mut(schema) else {
            continue;
        };
        if let Some(RefOr::T(Schema::Array(a))) = o.properties.get_mut(field) {
            a.max_items = Some(max);
        }
    }
}

/// A property of a component schema, to be completed.
fn property<'a>(
    components: &'a mut utoipa::openapi::Components,
    schema: &str,
    field: &str,
) -> Option<&'a mut Object> {
    let Some(RefOr::T(Schema::Object(o))) = components.schemas.get_mut(schema) else {
        return None;
    };
    match o.properties.get_mut(field) {
        Some(RefOr::T(Schema::Object(p))) => Some(p),
        _ => None,
    }
}

/// A session's (and a one-shot run's) `network`, exactly as this server takes it: with no
/// `serve --egress-allow` bound, an allowlist can name no domain (and so hold no secret); with
/// one, each entry is a domain pattern the bound must cover (400 `limit_exceeded` beyond it:
/// coverage is not a JSON Schema rule). Replaces the derived schema, whose `oneOf` cannot say
/// either.
pub(crate) fn document_network(api: &mut OpenApi, bound: &[String]) {
    let Some(components) = api.components.as_mut() else {
        return;
    };
    let max = if bound.is_empty() { 0 } else { 256 };
    let domain = serde_json::json!({
        "type": "string",
        "minLength": 1,
        "maxLength": 255,
        "description": "`pypi.org`, `*.example.com` (any name below it) or an IP literal",
        "pattern": r"^(?:\*\.)?[A-Za-z0-9.:\[\]-]+$"
    });
    let schema = serde_json::json!({
        "description": format!(
            "No network (`disabled`, the default) or HTTP(S) through runcell's proxy to the allowed domains only, within the server's bound and the API key's own when it has one (`runcell keys create|update --egress-allow` narrows, never widens: beyond it, 400 `limit_exceeded` naming the key). This server allows: {}.",
            if bound.is_empty() { "no domain (serve --egress-allow)".to_owned() } else { bound.join(", ") }
        ),
        "oneOf": [
            {
                "type": "object",
                "required": ["type"],
                "additionalProperties": false,
                "properties": {"type": {"type": "string", "enum": ["disabled"]}}
            },
            {
                "type": "object",
                "required": ["type", "allowed_domains"],
                "additionalProperties": false,
                "properties": {
                    "type": {"type": "string", "enum": ["allowlist"]},
                    "allowed_domains": {"type": "array", "maxItems": max, "items": domain},
                    "domain_secrets": {
                        "type": "array",
                        "maxItems": max,
                        "description": "Headers the proxy adds for one exact domain of `allowed_domains`; values read back as `<redacted>`",
                        "items": {
                            "type": "object",
                            "required": ["domain", "name", "value"],
                            "additionalProperties": false,
                            "properties": {
                                "domain": domain,
                                "name": {"type": "string", "pattern": r"^[A-Za-z0-9!#$%&'*+.^_`|~-]+$"},
                                "value": {"type": "string", "minLength": 1, "maxLength": 8192, "pattern": r"^[^\x00-\x08\x0a-\x1f\x7f]+$"}
                            }
                        }
                    }
                }
            }
        ]
    });
    if let Ok(schema) = serde_json::from_value::<Schema>(schema) {
        components
            .schemas
            .insert("NetworkPolicy".to_owned(), RefOr::T(schema));
    }
}
