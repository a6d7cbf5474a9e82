#!/usr/bin/env bash
# Builds SIF, the Apptainer/Singularity image of FLAVOR (make sif), then prints its size, with a warning above
# SIF_QUOTA_GIB (/projappl on Roihu holds 15 GiB). Three ways:
#  - FLAVOR=lumi, on LUMI: containers/lumi.def over LUMI's own TensorFlow container (LUMI_BASE_SIF: another
#    base .sif than the one the definition names). Unprivileged, Singularity builds it with proot.
#  - DEF=1 (FLAVOR=ngc), on Roihu's GPU login node, which has Apptainer but neither docker nor podman: the same
#    image from containers/roihu.def with `apptainer build --fakeroot`, as CSC advises: the build's /tmp on
#    $TMPDIR (the node's local disk) and, unless set, the layer cache APPTAINER_CACHEDIR in
#    $TMPDIR/apptainer-cache rather than in home (15 GiB quota).
#  - Otherwise from IMAGE (make image), which ENGINE (docker or podman) holds, through singularity.def.
# Env (make passes them): FLAVOR, SIF, IMAGE, ENGINE, DEF (1, or 0 or empty), SIF_QUOTA_GIB, LUMI_BASE_SIF.
# Exit status: 0 built, 1 a tool or the image is missing, 2 a bad variable; one line names it and the fix.
set -euo pipefail

die() { echo "sif: $1" >&2; exit "${2:-1}"; }
run() { (set -x; "$@"); }

flavor=${FLAVOR:?} sif=${SIF:?} image=${IMAGE:-} quota=${SIF_QUOTA_GIB:-}
case $flavor in
ngc) def=containers/roihu.def ;;
lumi) def=containers/lumi.def ;;
*) def="" ;;
esac
case ${DEF:-} in
"" | 0 | 1) ;;
*) die "DEF=$DEF is not 1 (build from the flavour's Apptainer definition) or 0" 2 ;;
esac
if [[ ${DEF:-} == 1 && -z $def ]]; then
    die "DEF=1: FLAVOR=$flavor has no Apptainer definition; FLAVOR=ngc has containers/roihu.def" 2
fi
[[ -n $quota ]] || die "SIF_QUOTA_GIB is empty; give the quota in GiB, e.g. 15" 2
[[ $quota =~ ^[0-9]+(\.[0-9]+)?$ ]] || die "SIF_QUOTA_GIB=$quota is not a number of GiB such as 15" 2

appt=$(command -v apptainer || command -v singularity) ||
    die "install Apptainer or Singularity (on LUMI: singularity is there)"

if [[ $flavor == lumi ]]; then
    if [[ $(id -u) != 0 ]] && ! command -v proot >/dev/null; then
        die "an unprivileged build needs proot: on LUMI run 'module load LUMI systools' (or PRoot) first"
    fi
    base=()
    if [[ -n ${LUMI_BASE_SIF:-} ]]; then base=(--build-arg "BASE_SIF=$LUMI_BASE_SIF"); fi
    run "$appt" build "${base[@]}" "$sif" "$def"
elif [[ ${DEF:-} == 1 ]]; then
    [[ -f $def ]] || die "$def is not here: run make in the repository's top folder"
    fakeroot=(--fakeroot)
    if [[ $(id -u) == 0 ]]; then fakeroot=(); fi
    bind=() where=""
    if [[ -n ${TMPDIR:-} && -d $TMPDIR ]]; then
        bind=("--bind=$TMPDIR:/tmp") where=", /tmp in the build bound to $TMPDIR"
        export APPTAINER_CACHEDIR=${APPTAINER_CACHEDIR:-$TMPDIR/apptainer-cache}
    fi
    echo "sif: building from $def; layer cache in ${APPTAINER_CACHEDIR:-$HOME/.apptainer/cache}$where"
    run "$appt" build "${fakeroot[@]}" "${bind[@]}" "$sif" "$def"
else
    read -ra engine <<<"${ENGINE:-}"
    if [[ ${#engine[@]} -eq 0 ]]; then
        die "neither a docker daemon nor podman is here to hold $image: make image FLAVOR=$flavor on a machine with one${def:+, or build from $def here: make sif FLAVOR=$flavor DEF=1}"
    fi
    "${engine[@]}" image inspect "$image" >/dev/null 2>&1 ||
        die "$ENGINE holds no image $image: run make image FLAVOR=$flavor first${def:+, or build from $def: make sif FLAVOR=$flavor DEF=1}"
    if [[ ${engine[0]##*/} == docker ]]; then
        sed -e "s|^From: .*|From: $image|" singularity.def >.sif.def
        run "$appt" build "$sif" .sif.def
        rm -f .sif.def
    else
        run "${engine[@]}" save "$image" -o .sif.tar
        sed -e 's/^Bootstrap: docker-daemon/Bootstrap: docker-archive/' -e 's|^From: .*|From: .sif.tar|' \
            singularity.def >.sif.def
        run "$appt" build "$sif" .sif.def
        rm -f .sif.def .sif.tar
    fi
fi

echo "sif: $sif is $(du -h "$sif" | cut -f 1) (du -h)"
if awk -v b="$(stat -c %s "$sif")" -v q="$quota" 'BEGIN { exit !(b > q * 1073741824) }'; then
    echo "sif: warning: $sif is more than SIF_QUOTA_GIB=$quota GiB, the quota of /projappl on Roihu: keep it on" \
        "/scratch/<project>/ (250 GiB) or ask CSC for more quota" >&2
fi
