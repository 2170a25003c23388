//! `vnvme serve --fdp HANDLES[:ru=SIZE]`: Flexible Data Placement as the operator
//! asks for it.

/// The reclaim unit size of `--fdp` unless given.
const DEFAULT_RU_SIZE: u64 = 64 << 20;

/// `--fdp HANDLES[:ru=SIZE]`.
pub fn parse(s: &str) -> Result<nvme_ctrl::FdpConfig, String> {
    let mut parts = s.split(':');
    let handles = parts.next().unwrap_or_default();
    let ruhs = handles.parse::<u16>().map_err(|_| {
        format!("{handles:?}: the number of reclaim unit handles, 1 to {}", nvme_ctrl::MAX_RUHS)
    })?;
    let mut ru_size = DEFAULT_RU_SIZE;
    for opt in parts {
        match opt.split_once('=') {
            Some(("ru", v)) => ru_size = crate::units::parse_size(v).map_err(|e| format!("ru={v}: {e}"))?,
            _ => return Err(format!("{opt:?}: the option is ru=SIZE (the reclaim unit size)")),
        }
    }
    let c = nvme_ctrl::FdpConfig { ruhs, ru_size };
    c.check()?;
    Ok(c)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handles_and_a_unit_size_parse_and_bad_ones_say_why() {
        assert_eq!(parse("8").unwrap(), nvme_ctrl::FdpConfig { ruhs: 8, ru_size: DEFAULT_RU_SIZE });
        assert_eq!(parse("2:ru=1M").unwrap(), nvme_ctrl::FdpConfig { ruhs: 2, ru_size: 1 << 20 });
        for bad in ["0", "128", "x", "4:ru=1000", "4:ru=0", "4:size=1M", "4:ru=1M:ru"] {
            assert!(parse(bad).is_err(), "{bad}");
        }
        assert!(parse("0").unwrap_err().contains("1 to 127"));
    }
}
