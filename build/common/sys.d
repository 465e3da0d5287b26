build/common/sys.o: common/sys.c common/sys.h common/buf.h common/err.h \
 common/path.h
common/sys.h:
common/buf.h:
common/err.h:
common/path.h:
