//! The VERSION handshake and its capabilities JSON.

use serde::{Deserialize, Serialize};

/// Protocol version we speak.
pub const MAJOR: u16 = 0;
pub const MINOR: u16 = 0;

/// Capabilities a peer offers (vfio-user.rst "Version").
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Capabilities {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_msg_fds: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_data_xfer_size: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_dma_maps: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pgsizes: Option<u64>,
    /// Cloud Hypervisor requires a migration object in the reply.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub migration: Option<Migration>,
}

/// For logs: the capabilities given, e.g. `max_msg_fds 16, max_data_xfer_size
/// 1048576, max_dma_maps 65535, pgsizes 0x1000`, or `none`.
impl std::fmt::Display for Capabilities {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut parts = Vec::new();
        if let Some(v) = self.max_msg_fds {
            parts.push(format!("max_msg_fds {v}"));
        }
        if let Some(v) = self.max_data_xfer_size {
            parts.push(format!("max_data_xfer_size {v}"));
        }
        if let Some(v) = self.max_dma_maps {
            parts.push(format!("max_dma_maps {v}"));
        }
        if let Some(v) = self.pgsizes {
            parts.push(format!("pgsizes {v:#x}"));
        }
        if let Some(m) = &self.migration {
            parts.push(format!("migration (pgsize {:#x})", m.pgsize));
        }
        if parts.is_empty() {
            f.write_str("none")
        } else {
            f.write_str(&parts.join(", "))
        }
    }
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Migration {
    pub pgsize: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_bitmap_size: Option<u64>,
}

#[derive(Debug, Serialize, Deserialize)]
struct Envelope {
    capabilities: Capabilities,
}

/// The VERSION payload: major, minor, then NUL-terminated JSON.
pub fn encode(major: u16, minor: u16, caps: &Capabilities) -> Vec<u8> {
    let mut v = Vec::new();
    v.extend_from_slice(&major.to_le_bytes());
    v.extend_from_slice(&minor.to_le_bytes());
    let json = serde_json::to_vec(&Envelope { capabilities: caps.clone() }).expect("serialisable");
    v.extend_from_slice(&json);
    v.push(0);
    v
}

/// Parses a VERSION payload. Missing JSON means default capabilities.
pub fn decode(payload: &[u8]) -> Result<(u16, u16, Capabilities), String> {
    if payload.len() < 4 {
        return Err(format!("VERSION payload of {} bytes is too short", payload.len()));
    }
    let major = u16::from_le_bytes([payload[0], payload[1]]);
    let minor = u16::from_le_bytes([payload[2], payload[3]]);
    let rest = &payload[4..];
    let json = match rest.iter().position(|&b| b == 0) {
        Some(i) => &rest[..i],
        None => rest,
    };
    if json.is_empty() {
        return Ok((major, minor, Capabilities::default()));
    }
    // Unknown keys are allowed; only the known ones must be well formed.
    let v: serde_json::Value = serde_json::from_slice(json).map_err(|e| format!("VERSION JSON: {e}"))?;
    let caps = match v.get("capabilities") {
        Some(c) => serde_json::from_value(c.clone()).map_err(|e| format!("VERSION capabilities: {e}"))?,
        None => Capabilities::default(),
    };
    Ok((major, minor, caps))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_qemu_style_payload() {
        let caps = Capabilities { max_msg_fds: Some(16), pgsizes: Some(4096), ..Default::default() };
        let p = encode(0, 0, &caps);
        assert_eq!(*p.last().unwrap(), 0);
        let (ma, mi, c) = decode(&p).unwrap();
        assert_eq!((ma, mi), (0, 0));
        assert_eq!(c, caps);
        let qemu = br#"{"capabilities":{"migration":{"pgsize":4096,"max_bitmap_size":268435456},"max_msg_fds":16,"max_data_xfer_size":1048576,"pgsizes":4096,"max_dma_maps":65535,"write_multiple":true}}"#;
        let mut p = vec![0, 0, 0, 0];
        p.extend_from_slice(qemu);
        p.push(0);
        let (_, _, c) = decode(&p).unwrap();
        assert_eq!(c.max_msg_fds, Some(16));
        assert_eq!(c.migration.unwrap().pgsize, 4096);
        assert!(decode(&[0, 0]).is_err());
        assert!(decode(b"\0\0\0\0{not json").is_err());
        assert!(decode(b"\0\0\0\0{\"capabilities\":{\"max_msg_fds\":\"x\"}}").is_err());
    }
}
