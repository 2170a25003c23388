//! What an `rbd:` namespace names: pool, RADOS namespace, image, snapshot, and how
//! to reach the cluster.

use std::fmt;
use std::path::PathBuf;

/// What an `rbd:` namespace names.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RbdSpec {
    pub pool: String,
    /// The RADOS namespace within the pool (empty: the default one).
    pub namespace: String,
    pub image: String,
    /// A snapshot, opened read-only.
    pub snap: Option<String>,
    /// ceph.conf to read (None: librados' default search, and CEPH_CONF).
    pub conf: Option<PathBuf>,
    /// The client's user name without "client." (None: "admin").
    pub id: Option<String>,
    pub keyring: Option<PathBuf>,
    /// How long librados waits for an OSD or monitor before failing a request
    /// (ETIMEDOUT, which the guest sees as Namespace Not Ready), unless the
    /// configuration sets its own: vnvme sets it to the namespace's hold (`hold=`,
    /// within its command timeout). None: librados' default (forever).
    pub op_timeout: Option<std::time::Duration>,
}

impl RbdSpec {
    /// Parses the image part, `POOL/IMAGE[@SNAP]` or `POOL/NAMESPACE/IMAGE[@SNAP]`.
    pub fn parse_image(s: &str) -> Result<RbdSpec, String> {
        let (path, snap) = match s.split_once('@') {
            Some((p, snap)) if !snap.is_empty() => (p, Some(snap.to_string())),
            Some(_) => return Err(format!("rbd:{s}: empty snapshot name after '@'")),
            None => (s, None),
        };
        let parts: Vec<&str> = path.split('/').collect();
        let (pool, namespace, image) = match parts[..] {
            [p, i] => (p, "", i),
            [p, n, i] => (p, n, i),
            _ => return Err(format!("rbd:{s}: expected rbd:POOL/IMAGE or rbd:POOL/NAMESPACE/IMAGE")),
        };
        if pool.is_empty() || image.is_empty() || parts.len() == 3 && namespace.is_empty() {
            return Err(format!("rbd:{s}: empty pool, namespace or image name"));
        }
        if s.contains('\0') {
            return Err("rbd: a name holds a NUL byte".into());
        }
        Ok(RbdSpec {
            pool: pool.into(),
            namespace: namespace.into(),
            image: image.into(),
            snap,
            ..Default::default()
        })
    }

    /// Takes an option this backend knows (`conf`, `id`, `keyring`); false if the
    /// name is not one of them.
    pub fn set_option(&mut self, name: &str, value: &str) -> Result<bool, String> {
        if value.is_empty() || value.contains('\0') {
            return Err(format!("{name}=: an empty or NUL-holding value"));
        }
        match name {
            "conf" => self.conf = Some(value.into()),
            "id" => self.id = Some(value.strip_prefix("client.").unwrap_or(value).into()),
            "keyring" => self.keyring = Some(value.into()),
            _ => return Ok(false),
        }
        Ok(true)
    }
}

impl fmt::Display for RbdSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "rbd:{}/", self.pool)?;
        if !self.namespace.is_empty() {
            write!(f, "{}/", self.namespace)?;
        }
        write!(f, "{}", self.image)?;
        if let Some(s) = &self.snap {
            write!(f, "@{s}")?;
        }
        Ok(())
    }
}
