//! Builds the S3-compatible bucket client from `OBJECT_STORAGE_*`: path-style addressing,
//! HTTPS through rustls (aws-lc-rs), plain HTTP only for an endpoint on loopback.

use std::net::IpAddr;
use std::sync::Arc;

use object_store::aws::AmazonS3Builder;
use object_store::{ClientOptions, ObjectStore};

use crate::config::ObjectStorage;

/// Why the bucket client could not be built (never names credentials).
#[derive(Debug, thiserror::Error)]
pub enum BucketError {
    /// The endpoint is not a usable URL, or is plain HTTP off loopback.
    #[error("OBJECT_STORAGE_ENDPOINT: {0}")]
    Endpoint(&'static str),
    /// The client refused its settings.
    #[error("object storage client: {0}")]
    Client(String),
}

/// Whether `url` is `http://` to a loopback host (the only place plain HTTP is allowed).
fn loopback_http(url: &reqwest::Url) -> bool {
    let host = url.host_str().unwrap_or_default();
    let host = host.trim_start_matches('[').trim_end_matches(']');
    url.scheme() == "http"
        && (host == "localhost" || host.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback()))
}

/// The bucket client for `cfg`.
pub fn open(cfg: &ObjectStorage) -> Result<Arc<dyn ObjectStore>, BucketError> {
    let mut builder = AmazonS3Builder::new()
        .with_bucket_name(&cfg.bucket)
        .with_region(&cfg.region);
    let mut options = ClientOptions::new();
    if let Some(endpoint) = &cfg.endpoint {
        let url = reqwest::Url::parse(endpoint).map_err(|_| BucketError::Endpoint("not a URL"))?;
        if !url.username().is_empty() || url.password().is_some() {
            return Err(BucketError::Endpoint(
                "credentials belong in OBJECT_STORAGE_ACCESS_KEY_ID/SECRET_ACCESS_KEY",
            ));
        }
        match url.scheme() {
            "https" => {}
            "http" if loopback_http(&url) => options = options.with_allow_http(true),
            "http" => {
                return Err(BucketError::Endpoint(
                    "plain HTTP is allowed on loopback only",
                ));
            }
            _ => {
                return Err(BucketError::Endpoint(
                    "scheme must be https (or http on loopback)",
                ));
            }
        }
        builder = builder
            .with_endpoint(endpoint)
            .with_virtual_hosted_style_request(false);
    }
    if let Some(id) = &cfg.access_key_id {
        builder = builder.with_access_key_id(&id.0);
    }
    if let Some(secret) = &cfg.secret_access_key {
        builder = builder.with_secret_access_key(&secret.0);
    }
    let store = builder
        .with_client_options(options)
        .build()
        // The builder's messages name settings, not their values.
        .map_err(|e| BucketError::Client(e.to_string()))?;
    Ok(Arc::new(store))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Secret;

    fn cfg(endpoint: &str) -> ObjectStorage {
        ObjectStorage {
            bucket: "b".into(),
            endpoint: Some(endpoint.into()),
            region: "us-east-1".into(),
            access_key_id: Some(Secret("id".into())),
            secret_access_key: Some(Secret("secret".into())),
            prefix: None,
        }
    }

    #[test]
    fn plain_http_only_on_loopback_and_never_with_url_credentials() {
        assert!(open(&cfg("http://127.0.0.1:9000")).is_ok());
        assert!(open(&cfg("http://localhost:9000")).is_ok());
        assert!(open(&cfg("http://[::1]:9000")).is_ok());
        assert!(open(&cfg("https://s3.example.com")).is_ok());
        assert!(open(&cfg("http://s3.example.com")).is_err());
        assert!(open(&cfg("https://user:pw@s3.example.com")).is_err());
        assert!(open(&cfg("ftp://127.0.0.1")).is_err());
    }
}
