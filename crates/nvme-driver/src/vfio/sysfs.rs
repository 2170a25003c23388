//! Finding a PCI device's VFIO group through sysfs, with errors that say how to fix
//! the host's setup.

use std::io;
use std::path::{Path, PathBuf};

use super::ioctl::{ctx, invalid};

/// Canonical `DDDD:BB:DD.F` form of a PCI address; `BB:DD.F` gets domain 0000.
pub fn normalize_bdf(s: &str) -> io::Result<String> {
    let bad = || invalid(format!("{s:?} is not a PCI address (expected DDDD:BB:DD.F, e.g. 0000:01:00.0)"));
    let s = s.trim();
    let parts: Vec<&str> = s.split(':').collect();
    let (domain, bus, devfn) = match parts.as_slice() {
        [d, b, df] => (*d, *b, *df),
        [b, df] => ("0000", *b, *df),
        _ => return Err(bad()),
    };
    let (dev, func) = devfn.split_once('.').ok_or_else(bad)?;
    let hex = |x: &str, digits: usize, max: u32| {
        (x.len() == digits && x.chars().all(|c| c.is_ascii_hexdigit()))
            .then(|| u32::from_str_radix(x, 16).ok())
            .flatten()
            .filter(|v| *v <= max)
            .ok_or_else(bad)
    };
    let (d, b, v, f) = (hex(domain, 4, 0xffff)?, hex(bus, 2, 0xff)?, hex(dev, 2, 0x1f)?, hex(func, 1, 7)?);
    Ok(format!("{d:04x}:{b:02x}:{v:02x}.{f:x}"))
}

/// The group number at the end of a device's `iommu_group` link
/// (`../../../kernel/iommu_groups/N`).
pub fn group_id_from_link(target: &Path) -> io::Result<u32> {
    target.file_name().and_then(|n| n.to_str()).and_then(|n| n.parse().ok()).ok_or_else(|| {
        invalid(format!("iommu_group link {} does not end in a group number", target.display()))
    })
}

/// A device's VFIO group: its number and character device.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GroupLocation {
    pub id: u32,
    /// `/dev/vfio/N`, or `/dev/vfio/noiommu-N` for a no-IOMMU group.
    pub path: PathBuf,
    pub noiommu: bool,
}

/// Finds the VFIO group of `bdf` (canonical form) under `sys` (normally `/sys`) and
/// `dev` (normally `/dev/vfio`), with errors that say how to fix the setup.
pub fn locate(sys: &Path, dev: &Path, bdf: &str) -> io::Result<GroupLocation> {
    let node = sys.join("bus/pci/devices").join(bdf);
    if !node.exists() {
        return Err(io::Error::new(
            io::ErrorKind::NotFound,
            format!("no PCI device {bdf} ({} does not exist)", node.display()),
        ));
    }
    let rebind = format!(
        "bind it to vfio-pci: echo vfio-pci > {p}/driver_override; \
         echo {bdf} > {p}/driver/unbind; echo {bdf} > {s}/bus/pci/drivers_probe",
        p = node.display(),
        s = sys.display()
    );
    match std::fs::read_link(node.join("driver")) {
        Ok(t) => {
            let driver = t.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
            if driver != "vfio-pci" {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!("PCI device {bdf} is bound to {driver}, not vfio-pci; {rebind}"),
                ));
            }
        }
        Err(_) => {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("PCI device {bdf} is not bound to any driver; {rebind}"),
            ))
        }
    }
    let link = std::fs::read_link(node.join("iommu_group")).map_err(|e| {
        ctx(
            e,
            format!(
                "PCI device {bdf} has no IOMMU group (enable the IOMMU, e.g. intel_iommu=on, or load \
                 vfio with enable_unsafe_noiommu_mode=1)"
            ),
        )
    })?;
    let id = group_id_from_link(&link)?;
    let normal = dev.join(id.to_string());
    let noiommu = dev.join(format!("noiommu-{id}"));
    if normal.exists() {
        Ok(GroupLocation { id, path: normal, noiommu: false })
    } else if noiommu.exists() {
        Ok(GroupLocation { id, path: noiommu, noiommu: true })
    } else {
        Err(io::Error::new(
            io::ErrorKind::NotFound,
            format!(
                "VFIO group {id} of {bdf} has no device node ({} or {})",
                normal.display(),
                noiommu.display()
            ),
        ))
    }
}

#[cfg(test)]
pub(crate) mod fake {
    use std::fs::File;
    use std::path::PathBuf;

    /// A fake /sys and /dev/vfio in a temporary directory.
    pub(crate) struct FakeSys {
        root: PathBuf,
    }

    impl FakeSys {
        pub(crate) fn new(tag: &str) -> Self {
            let root = std::env::temp_dir().join(format!("vnvme-vfio-{tag}-{}", std::process::id()));
            let _ = std::fs::remove_dir_all(&root);
            std::fs::create_dir_all(root.join("sys/bus/pci/devices")).unwrap();
            std::fs::create_dir_all(root.join("sys/kernel/iommu_groups")).unwrap();
            std::fs::create_dir_all(root.join("sys/bus/pci/drivers/vfio-pci")).unwrap();
            std::fs::create_dir_all(root.join("sys/bus/pci/drivers/nvme")).unwrap();
            std::fs::create_dir_all(root.join("dev")).unwrap();
            FakeSys { root }
        }
        pub(crate) fn sys(&self) -> PathBuf {
            self.root.join("sys")
        }
        pub(crate) fn dev(&self) -> PathBuf {
            self.root.join("dev")
        }
        pub(crate) fn device(&self, bdf: &str, driver: Option<&str>, group: Option<u32>) {
            let d = self.sys().join("bus/pci/devices").join(bdf);
            std::fs::create_dir_all(&d).unwrap();
            if let Some(drv) = driver {
                std::os::unix::fs::symlink(self.sys().join("bus/pci/drivers").join(drv), d.join("driver"))
                    .unwrap();
            }
            if let Some(g) = group {
                let gd = self.sys().join("kernel/iommu_groups").join(g.to_string());
                std::fs::create_dir_all(&gd).unwrap();
                std::os::unix::fs::symlink(gd, d.join("iommu_group")).unwrap();
            }
        }
        pub(crate) fn node(&self, name: &str) {
            File::create(self.dev().join(name)).unwrap();
        }
    }

    impl Drop for FakeSys {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.root);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::fake::FakeSys;
    use super::*;

    #[test]
    fn pci_addresses_are_normalized_and_validated() {
        assert_eq!(normalize_bdf("0000:01:00.0").unwrap(), "0000:01:00.0");
        assert_eq!(normalize_bdf("01:00.0").unwrap(), "0000:01:00.0");
        assert_eq!(normalize_bdf(" 0001:3B:1f.7\n").unwrap(), "0001:3b:1f.7");
        for bad in
            ["", "01:00", "0000:01:00", "01:00.8", "01:20.0", "zz:00.0", "0:01:00.0", "1:2:3:4.0", "01:00.-1"]
        {
            let e = normalize_bdf(bad).unwrap_err();
            assert_eq!(e.kind(), io::ErrorKind::InvalidInput, "{bad:?}");
            assert!(e.to_string().contains("DDDD:BB:DD.F"), "{e}");
        }
    }

    #[test]
    fn iommu_group_number_comes_from_the_link() {
        assert_eq!(group_id_from_link(Path::new("../../../kernel/iommu_groups/12")).unwrap(), 12);
        assert_eq!(group_id_from_link(Path::new("/sys/kernel/iommu_groups/0")).unwrap(), 0);
        assert!(group_id_from_link(Path::new("../../iommu_groups/abc")).is_err());
        assert!(group_id_from_link(Path::new("")).is_err());
    }

    #[test]
    fn locating_the_group_of_a_vfio_bound_device() {
        let f = FakeSys::new("locate");
        f.device("0000:01:00.0", Some("vfio-pci"), Some(7));
        f.node("7");
        let loc = locate(&f.sys(), &f.dev(), "0000:01:00.0").unwrap();
        assert_eq!(loc, GroupLocation { id: 7, path: f.dev().join("7"), noiommu: false });

        f.device("0000:02:00.0", Some("vfio-pci"), Some(3));
        f.node("noiommu-3");
        let loc = locate(&f.sys(), &f.dev(), "0000:02:00.0").unwrap();
        assert!(loc.noiommu);
        assert_eq!(loc.path, f.dev().join("noiommu-3"));
    }

    #[test]
    fn locating_explains_what_is_wrong() {
        let f = FakeSys::new("errors");
        let e = locate(&f.sys(), &f.dev(), "0000:09:00.0").unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::NotFound);
        assert!(e.to_string().contains("no PCI device 0000:09:00.0"), "{e}");

        f.device("0000:01:00.0", Some("nvme"), Some(4));
        let e = locate(&f.sys(), &f.dev(), "0000:01:00.0").unwrap_err().to_string();
        assert!(e.contains("bound to nvme, not vfio-pci") && e.contains("driver_override"), "{e}");

        f.device("0000:02:00.0", None, Some(5));
        let e = locate(&f.sys(), &f.dev(), "0000:02:00.0").unwrap_err().to_string();
        assert!(e.contains("not bound to any driver"), "{e}");

        f.device("0000:03:00.0", Some("vfio-pci"), None);
        let e = locate(&f.sys(), &f.dev(), "0000:03:00.0").unwrap_err().to_string();
        assert!(e.contains("no IOMMU group") && e.contains("enable_unsafe_noiommu_mode"), "{e}");

        f.device("0000:04:00.0", Some("vfio-pci"), Some(6));
        let e = locate(&f.sys(), &f.dev(), "0000:04:00.0").unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::NotFound);
        assert!(e.to_string().contains("VFIO group 6") && e.to_string().contains("noiommu-6"), "{e}");
    }
}
