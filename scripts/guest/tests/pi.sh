# shellcheck shell=dash
# Metadata and end-to-end data protection, NSID 5 (PI_DEV): 8 bytes of metadata
# per 512-byte block holding type 1 protection information (vnvme ms=8:pi=1,
# QEMU ms=8,pi=1). Linux's block integrity layer generates the protection
# information of every write and verifies it on every read, and asks the
# controller to check guard and reference tag both ways. Checked: what Linux and
# nvme-cli see of the format, fio with verify through it, a block corrupted on
# the host under the guest (@@VNVME-HOST pi-corrupt@@) failing its read with the
# guard check error instead of reading as good data, and the block good again once
# rewritten. PI_CORRUPT_LBA (config.sh) is where the host corrupts.
dev=${PI_DEV#/dev/}
integ=/sys/block/$dev/integrity
t_eq "NSID 5 ($PI_DEV): integrity format, interval, generate and verify" \
    "$(cat $integ/format 2>&1) $(cat $integ/protection_interval_bytes 2>&1) $(cat $integ/write_generate 2>&1) $(cat $integ/read_verify 2>&1)" \
    "T10-DIF-TYPE1-CRC 512 1 1"
if nvme id-ns "$PI_DEV" >/tmp/pid 2>&1; then
    # What a host needs: metadata in a separate buffer (MC bit 1), type 1
    # supported (DPC bit 0) and in use, last in the metadata (DPS 1), and the
    # format in use 512 bytes of data with 8 of metadata.
    t_eq "nvme id-ns: mc bit 1, dpc bit 0, dps, the format in use" \
        "$(($(field mc </tmp/pid) & 2)) $(($(field dpc </tmp/pid) & 1)) $(field dps </tmp/pid) $(grep '(in use)' /tmp/pid | sed -n 's/.*ms:\([0-9]*\) *lbads:\([0-9]*\).*/\1+\2/p')" \
        "2 1 0x1 8+9"
else
    t_fail "nvme id-ns $PI_DEV: $(tail -2 /tmp/pid)"
fi
# Extended LBAs: Format NVM with MSET=1, each block's 8 bytes inline after its
# data. Linux keeps the block device and has the controller insert and strip the
# protection information (PRACT); passthrough carries the interleaved layout.
# The device's own index of the format with 512 bytes of data and 8 of metadata.
m8=$(sed -n 's/^lbaf *\([0-9]*\) *: *ms:8 *lbads:9 .*/\1/p' /tmp/pid | head -1)
pi_format() { # MSET
    nvme format "$PI_DEV" --lbaf="${m8:-2}" --ms="$1" --pi=1 --force >/tmp/fmt 2>&1 && sleep 1 &&
        nvme id-ns "$PI_DEV" >/tmp/pid 2>&1
}
if pi_format 1; then
    t_eq "nvme format --ms=1: flbas (512+8, metadata inline)" "$(field flbas </tmp/pid)" "$(printf '0x%x' $((0x10 | ${m8:-2})))"
    fio_verified "metadata inline: fio verify, the controller inserting and stripping the PI" \
        --filename="$PI_DEV" --ioengine="$ENGINE" --direct=1 --rw=randwrite --bs=4k --iodepth=8 --size=4M \
        --verify=crc32c --verify_fatal=1 --name=ext
    # One block through passthrough: 512 bytes of data, then 8 of PI whose
    # application tag is FFFFh (never checked); back the same.
    { dd if=/dev/urandom bs=512 count=1 2>/dev/null; printf '\001\002\377\377\003\004\005\006'; } >/tmp/pe
    if nvme write "$PI_DEV" --start-block=$((PI_CORRUPT_LBA + 96)) --block-count=0 --data-size=520 \
        --data=/tmp/pe >/tmp/o 2>&1 &&
        nvme read "$PI_DEV" --start-block=$((PI_CORRUPT_LBA + 96)) --block-count=0 --data-size=520 \
            --data=/tmp/pe.back >>/tmp/o 2>&1 && cmp -s /tmp/pe /tmp/pe.back; then
        t_pass "metadata inline: nvme write/read of 520 bytes (data, then its PI) back as written"
    else
        t_fail "metadata inline: nvme write/read of 520 bytes: $(tail -2 /tmp/o)"
    fi
else
    t_fail "nvme format --lbaf=${m8:-2} --ms=1 --pi=1: $(tail -2 /tmp/fmt)"
fi
if pi_format 0; then
    t_eq "nvme format back to a separate buffer: flbas, integrity format" \
        "$(field flbas </tmp/pid) $(cat $integ/format 2>&1)" "$(printf '0x%x' ${m8:-2}) T10-DIF-TYPE1-CRC"
else
    t_fail "nvme format --lbaf=${m8:-2} --ms=0 --pi=1: $(tail -2 /tmp/fmt)"
fi
fio_verified "fio randwrite 4K-64K QD 8, crc32c verify, through the integrity layer" \
    --filename="$PI_DEV" --ioengine="$ENGINE" --direct=1 --rw=randwrite --bsrange=4k-64k --iodepth=8 \
    --size=16M --verify=crc32c --verify_fatal=1 --name=pi
# Copy with protection information: 8 blocks fio just wrote (Linux's PI, reference
# tags the LBAs) checked on the way out (PRINFOR guard, app and ref tag) and
# stripped, given new PI at the destination (PRACT on both sides, reference tags
# from there); the block
# layer's own verification then reads them good. Without PRACT the copied tags are
# the source's, and a destination reference check refuses them.
csrc=1024 cdst=$((PI_CORRUPT_LBA + 128))
if nvme copy "$PI_DEV" --sdlba=$cdst --slbs=$csrc --blocks=7 --prinfor=15 --prinfow=15 \
    --expected-ref-tags=$csrc --ref-tag=$cdst >/tmp/o 2>&1 &&
    dd if="$PI_DEV" of=/tmp/cpd bs=4096 count=1 skip=$((cdst / 8)) iflag=direct 2>>/tmp/o &&
    dd if="$PI_DEV" of=/tmp/cps bs=4096 count=1 skip=$((csrc / 8)) iflag=direct 2>>/tmp/o &&
    cmp -s /tmp/cps /tmp/cpd; then
    t_pass "nvme copy --prinfor=15 --prinfow=15: checked and stripped, new PI at the destination, read back good through the integrity layer"
else
    t_fail "nvme copy with PRINFOR/PRINFOW: $(tail -3 /tmp/o | tr '\n' ' ')"
fi
if nvme copy "$PI_DEV" --sdlba=$((cdst + 8)) --slbs=$csrc --blocks=7 --prinfow=1 \
    --ref-tag=$((cdst + 8)) >/tmp/o 2>&1; then
    t_fail "nvme copy carrying the source's reference tags past a destination reference check succeeded"
else
    t_pass "nvme copy --prinfow=1 (source tags carried, reference checked): refused: $(grep -io 'reference tag[^(]*' /tmp/o | head -1)"
fi
# Passthrough with a metadata buffer (nvme-cli --metadata): on kernels that use
# them, described by an SGL at MPTR (the controller sets SGLS bit 19); the bytes
# written come back. Their application tag is FFFFh: the block is never checked.
mlba=$((PI_CORRUPT_LBA + 64))
printf '\022\064\377\377\126\170\232\274' >/tmp/pm
dd if=/dev/urandom of=/tmp/pd bs=512 count=1 2>/dev/null
if nvme write "$PI_DEV" --start-block=$mlba --block-count=0 --data-size=512 --data=/tmp/pd \
    --metadata-size=8 --metadata=/tmp/pm >/tmp/o 2>&1 &&
    nvme read "$PI_DEV" --start-block=$mlba --block-count=0 --data-size=512 --data=/tmp/pd.back \
        --metadata-size=8 --metadata=/tmp/pm.back >>/tmp/o 2>&1 &&
    cmp -s /tmp/pd /tmp/pd.back && cmp -s /tmp/pm /tmp/pm.back; then
    t_pass "nvme write/read with 8 bytes of metadata at LBA $mlba: data and metadata back as written"
else
    t_fail "nvme write/read with metadata at LBA $mlba: $(tail -2 /tmp/o)"
fi
# Compare with its metadata: the same data compares equal (the 8 bytes are all
# protection information, which Compare leaves out); one byte off does not.
cp /tmp/pd /tmp/pd.off
printf '\377' | dd of=/tmp/pd.off bs=1 seek=100 conv=notrunc 2>/dev/null
cmp -s /tmp/pd /tmp/pd.off && printf '\000' | dd of=/tmp/pd.off bs=1 seek=100 conv=notrunc 2>/dev/null
if nvme compare "$PI_DEV" --start-block=$mlba --block-count=0 --data-size=512 --data=/tmp/pd \
    --metadata-size=8 --metadata=/tmp/pm >/tmp/o 2>&1; then
    if nvme compare "$PI_DEV" --start-block=$mlba --block-count=0 \
        --data-size=512 --data=/tmp/pd.off --metadata-size=8 --metadata=/tmp/pm >/tmp/o 2>&1; then
        t_fail "nvme compare of a block one byte off succeeded"
    else
        t_pass "nvme compare with metadata: equal block equal, one byte off: $(grep -io 'compare[^(:]*fail[^(]*' /tmp/o | head -1)"
    fi
else
    t_fail "nvme compare with metadata at LBA $mlba: $(tail -2 /tmp/o)"
fi
# A known block, read back good, then corrupted under the guest.
off=$((PI_CORRUPT_LBA * 512))
dd if=/dev/urandom of=/tmp/pi4k bs=4096 count=1 2>/dev/null
# round_trip: /tmp/pi4k written at $off through the block layer and read back the same.
round_trip() {
    dd_write /tmp/pi4k "$PI_DEV" 4096 $((off / 4096)) >/tmp/o 2>&1 &&
        dd if="$PI_DEV" of=/tmp/pi4k.back bs=4096 count=1 skip=$((off / 4096)) iflag=direct 2>/tmp/o &&
        cmp -s /tmp/pi4k /tmp/pi4k.back
}
if round_trip; then
    t_pass "a 4 KiB block at LBA $PI_CORRUPT_LBA written and read back"
else
    t_fail "a 4 KiB block at LBA $PI_CORRUPT_LBA written and read back: $(tail -2 /tmp/o)"
fi
before=$(dmesg | wc -l)
echo "@@VNVME-HOST pi-corrupt@@"
# The host acts in the background: read until the read fails (30 s at most).
i=0 got=ok
while [ $i -lt 60 ]; do
    if ! dd if="$PI_DEV" of=/dev/null bs=4096 count=1 skip=$((off / 4096)) iflag=direct 2>/tmp/o; then
        got=$(tail -1 /tmp/o)
        break
    fi
    usleep 500000
    i=$((i + 1))
done
case $got in
ok) t_fail "the block corrupted on the host still reads as good data after 30 s" ;;
*) t_pass "the block corrupted on the host fails its read: ${got#*: }" ;;
esac
# The controller's own status (not the kernel's verification, which fails too):
# Linux logs the command with SCT 2h / SC 82h, End-to-end Guard Check Error.
if dmesg | tail -n +$((before + 1)) | grep -qiE "sc 0x82|guard check"; then
    t_pass "guest kernel log names the guard check: $(dmesg | tail -n +$((before + 1)) | grep -iE 'sc 0x82|guard check' | head -1 | sed 's/^\[[ 0-9.]*\] //')"
else
    t_fail "guest kernel log: no guard check error after the corrupted read"
    dmesg | tail -n +$((before + 1)) | tail -5
fi
# Rewritten: new protection information, good again.
if round_trip; then
    t_pass "the corrupted block rewritten reads back good"
else
    t_fail "the corrupted block rewritten: $(tail -2 /tmp/o)"
fi
