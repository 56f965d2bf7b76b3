//! Which image a container runs and how the test process reaches it: [`DockerOptions`],
//! read from the environment by default.

use std::fmt;
use std::str::FromStr;

use crate::error::TestkitError;

/// The environment variable naming the image: `name[:tag]` or `name@sha256:…`.
pub const IMAGE_ENV: &str = "PGTENANT_TESTKIT_IMAGE";

/// The environment variable choosing the network mode: `published` or `host`.
pub const NETWORK_ENV: &str = "PGTENANT_TESTKIT_DOCKER_NETWORK";

/// The image used unless [`IMAGE_ENV`] or [`DockerOptions::with_image`] says otherwise: the
/// official image's newest released major (18; 19 had only beta tags on Docker Hub in
/// September 2026), on Alpine, the smaller variant. A major tag rather than a minor one, so
/// CI gets the minor (security) releases.
pub const DEFAULT_IMAGE: &str = "postgres:18-alpine";

/// How the test process reaches the container's PostgreSQL.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DockerNetwork {
    /// The container's port 5432 is published on an ephemeral host port (on `127.0.0.1` when the
    /// engine is local). What CI runners and laptops with Docker do.
    #[default]
    Published,
    /// The container shares the host's network (`--network host`); PostgreSQL listens on
    /// `127.0.0.1` at a free port (`-c port=NNNN`). For machines where containers may not use
    /// a bridge network. Needs a local engine.
    Host,
}

impl DockerNetwork {
    /// `published` or `host`, as [`NETWORK_ENV`] takes them.
    pub fn as_str(self) -> &'static str {
        match self {
            DockerNetwork::Published => "published",
            DockerNetwork::Host => "host",
        }
    }
}

impl fmt::Display for DockerNetwork {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for DockerNetwork {
    type Err = TestkitError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim().to_ascii_lowercase().as_str() {
            "published" => Ok(DockerNetwork::Published),
            "host" => Ok(DockerNetwork::Host),
            _ => Err(TestkitError::InvalidSetting {
                name: NETWORK_ENV,
                value: s.to_owned(),
                expected: "`published` or `host`",
            }),
        }
    }
}

/// Which image a container runs and how it is reached.
///
/// [`DockerOptions::from_env`] is what the `docker` source uses:
/// `PGTENANT_TESTKIT_IMAGE` (default [`DEFAULT_IMAGE`]) and
/// `PGTENANT_TESTKIT_DOCKER_NETWORK` (default [`DockerNetwork::Published`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DockerOptions {
    pub(crate) image: String,
    pub(crate) network: DockerNetwork,
}

impl Default for DockerOptions {
    fn default() -> Self {
        DockerOptions {
            image: DEFAULT_IMAGE.to_owned(),
            network: DockerNetwork::Published,
        }
    }
}

impl DockerOptions {
    /// The defaults, overridden by `PGTENANT_TESTKIT_IMAGE` and
    /// `PGTENANT_TESTKIT_DOCKER_NETWORK` where set (and not empty).
    pub fn from_env() -> Result<DockerOptions, TestkitError> {
        let mut options = DockerOptions::default();
        if let Some(image) = env_value(IMAGE_ENV) {
            options.image = image;
        }
        if let Some(network) = env_value(NETWORK_ENV) {
            options.network = network.parse()?;
        }
        Ok(options)
    }

    /// Runs this image (`name[:tag]`, `registry:port/name:tag` or `name@sha256:…`); it must
    /// behave like the official `postgres` image (`POSTGRES_HOST_AUTH_METHOD`, arguments
    /// passed on to `postgres`, the ready line on stderr).
    #[must_use]
    pub fn with_image(mut self, image: impl Into<String>) -> DockerOptions {
        self.image = image.into().trim().to_owned();
        self
    }

    /// Reaches the server this way.
    #[must_use]
    pub fn with_network(mut self, network: DockerNetwork) -> DockerOptions {
        self.network = network;
        self
    }

    /// The image reference.
    pub fn image(&self) -> &str {
        &self.image
    }

    /// The network mode.
    pub fn network(&self) -> DockerNetwork {
        self.network
    }
}

pub(crate) fn env_value(name: &str) -> Option<String> {
    std::env::var(name)
        .ok()
        .map(|v| v.trim().to_owned())
        .filter(|v| !v.is_empty())
}

/// `name:tag` → (`name`, `tag`); no tag → `latest`. A digest splits the same way
/// (`name@sha256`, hex), which testcontainers joins back with `:` into a valid reference.
pub(crate) fn split_image(reference: &str) -> (String, String) {
    let last_slash = reference.rfind('/').map_or(0, |i| i + 1);
    match reference[last_slash..].rfind(':') {
        Some(i) => (
            reference[..last_slash + i].to_owned(),
            reference[last_slash + i + 1..].to_owned(),
        ),
        None => (reference.to_owned(), "latest".to_owned()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_image_references() {
        for (reference, name, tag) in [
            ("postgres:18-alpine", "postgres", "18-alpine"),
            ("local/postgres:15", "local/postgres", "15"),
            ("postgres", "postgres", "latest"),
            ("registry:5000/pg", "registry:5000/pg", "latest"),
            ("registry:5000/pg:17", "registry:5000/pg", "17"),
            ("postgres@sha256:abcd", "postgres@sha256", "abcd"),
        ] {
            assert_eq!(
                split_image(reference),
                (name.to_owned(), tag.to_owned()),
                "{reference}"
            );
            // testcontainers joins them with ':' into the same reference (or adds :latest).
            let joined = format!("{name}:{tag}");
            assert!(
                joined == reference || joined == format!("{reference}:latest"),
                "{joined}"
            );
        }
    }

    #[test]
    fn parses_network_modes() {
        assert_eq!(
            " Host ".parse::<DockerNetwork>().expect("host"),
            DockerNetwork::Host
        );
        assert_eq!(
            "published".parse::<DockerNetwork>().expect("published"),
            DockerNetwork::Published
        );
        let e = "bridge".parse::<DockerNetwork>().expect_err("unknown");
        let message = e.to_string();
        assert!(
            message.contains(NETWORK_ENV) && message.contains("\"bridge\""),
            "{message}"
        );
    }
}
