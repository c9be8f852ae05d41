import json,glob,statistics,sys
prefix=sys.argv[1] if len(sys.argv)>1 else ''
data={}
for f in sorted(glob.glob(prefix+'new_*.json'))+sorted(glob.glob(prefix+'base_*.json')):
    base='base_' in f
    for r in json.load(open(f))['rows']:
        t=r['transport']
        if t=='raw-tcp': t='raw-tcp'+(' (base run)' if base else '')
        elif base: t='tcp (before TLS)'
        key=(r['op'],r['size'],r['window'])
        data.setdefault(key,{}).setdefault(t,[]).append(r['median'])
cols=['tcp (before TLS)','tcp','tcp-secret','tcp-tls']
print('| op | size | window | '+' | '.join(cols)+' | tls / tcp |')
print('|'+'---|'*(len(cols)+4))
for key in sorted(data, key=lambda k:(['push','pull','push+pull','push-rtt','pull-rtt','one-way','rtt'].index(k[0]) if k[0] in ['push','pull','push+pull','push-rtt','pull-rtt','one-way','rtt'] else 9,k[1],k[2])):
    d=data[key]
    if 'tcp' not in d: continue
    med={c:statistics.median(d[c]) for c in cols if c in d}
    unit='us' if 'rtt' in key[0] else 'MB/s'
    fmt=lambda v:('%.1f'%v if unit=='us' else '%.0f'%v)
    sz=key[1]; s='%d KiB'%(sz//1024) if sz<1<<20 else '%d MiB'%(sz>>20)
    print('| %s | %s | %d | '%(key[0],s,key[2])+' | '.join(fmt(med[c])+(' '+unit if c==cols[0] else '') if c in med else '-' for c in cols)+' | %.2fx |'%(med['tcp-tls']/med['tcp']))
