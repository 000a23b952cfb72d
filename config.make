# Appended to objs/Makefile by nginx's configure: rules that build the C++17
# core of ngx_http_upstream_affinity_module into a static library, and make the
# module's shared object depend on it.

affinity_core_dir=$NGX_OBJS/addon/affinity_core
affinity_core_objs=
affinity_core_hdrs=`echo $ngx_addon_dir/src/core/*.h \
                         $ngx_addon_dir/src/core/include/*.h`

mkdir -p $affinity_core_dir

# From the environment of configure, for builds other than the release one
# (scripts/build-module.sh --sanitize sets both):
#   AFFINITY_NDEBUG=0          keep the core's assertions (default 1: -DNDEBUG)
#   AFFINITY_CXXFLAGS_EXTRA    appended to the core's flags, after the others
case "${AFFINITY_NDEBUG:-1}" in
    0) affinity_ndebug= ;;
    *) affinity_ndebug=" -DNDEBUG" ;;
esac

cat << END                                                >> $NGX_MAKEFILE

AFFINITY_CXX = \$(if \$(CXX),\$(CXX),g++)
AFFINITY_CXXFLAGS = -std=c++17 -O3 -g$affinity_ndebug -fPIC -fvisibility=hidden \\
	-fvisibility-inlines-hidden -Wall -Wextra -Werror=return-type \\
	${AFFINITY_MARCH:+-march=$AFFINITY_MARCH} \\
	-I $ngx_addon_dir/src/core/include -I $ngx_addon_dir/src/core${AFFINITY_CXXFLAGS_EXTRA:+ $AFFINITY_CXXFLAGS_EXTRA}

END

for affinity_src in $ngx_addon_dir/src/core/*.cpp
do
    affinity_obj=$affinity_core_dir/`basename $affinity_src .cpp`.o
    affinity_core_objs="$affinity_core_objs $affinity_obj"

    cat << END                                            >> $NGX_MAKEFILE
$affinity_obj: $affinity_src $affinity_core_hdrs
	\$(AFFINITY_CXX) -c \$(AFFINITY_CXXFLAGS) -o $affinity_obj $affinity_src

END
done

cat << END                                                >> $NGX_MAKEFILE
$AFFINITY_CORE_LIB: $affinity_core_objs
	rm -f $AFFINITY_CORE_LIB
	ar rcs $AFFINITY_CORE_LIB $affinity_core_objs

$NGX_OBJS/ngx_http_upstream_affinity_module$ngx_modext: $AFFINITY_CORE_LIB \\
	$ngx_addon_dir/src/ngx_http_upstream_affinity.map

END
