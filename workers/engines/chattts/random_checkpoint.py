"""Randomly initialised ChatTTS checkpoints in ChatTTS's own asset layout, for tests and benchmarks.

``tiny`` (hidden 64, 2 layers, about 2.6 MB) runs the real inference code in milliseconds; ``full`` is
the published architecture (279.7M parameters) with random weights: it sounds like noise but costs
exactly what the real model costs, which is what the benchmarks measure. Both load through the same
loader users use (``source="custom"``): the directory carries its own ``sha256_map.json`` (ChatTTS checks
every asset against a hash map) and, for ``tiny``, a ``voxroom_arch.json`` with its shapes.
"""

from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path
from typing import Any, Literal

from workers.engines.chattts.architecture import ARCH_FILE
from workers.engines.chattts.weights import ASSET_FILES

log = logging.getLogger("voxroom.engine.chattts")

Size = Literal["tiny", "full"]

SHA256_FILE = "sha256_map.json"

SPECIAL_TOKENS: tuple[str, ...] = (
    "[Stts]", "[Ptts]", "[spk_emb]", "[empty_spk]", "[Sbreak]", "[Pbreak]", "[Ebreak]",
    "[uv_break]", "[v_break]", "[lbreak]", "[laugh]",
    *(f"[break_{i}]" for i in range(8)), *(f"[speed_{i}]" for i in range(10)),
    *(f"[oral_{i}]" for i in range(10)), *(f"[laugh_{i}]" for i in range(3)),
)

# Common Chinese characters so that Chinese test text is not all [UNK].
_CJK = ("的一是不了在人有我他这个们中来上大为和国地到以说时要就出会可也你对生能而子那得于着下自之年过发后"
        "作里用道行所然家种事成方多经么去法学如都同现当没动面起看定天分还进好小部其些主样理心她本前开但因"
        "只从想实日军者意无力它与长把机十民第公此已工使情明性知全三又关点正业外将两高间由问很最重并物手应"
        "战向头文体政美相见被利什二等产或新己制身果加西斯月话合回特代内信表化老给世位次度门任常先海通教儿"
        "原东声提立及比员解水名真论处走义各入几口认条平系气题活尔更别打女变四神总何电数安少报才结反受目太"
        "量再感建务做接必场件计管期市直德资命山金指克许统区保至队形社便空决治展马科司五基眼书非则听白却界"
        "达光放强即像难且权思王象完设式色路记南品住告类求据程北边死张该交规万取拉格望觉术领共确传师观清今"
        "切院让识候带导争运笑飞风步改收根干造言联持组每济车亲极林服快办议往元英士证近失转夫令准布始怎呢存"
        "未远叫台单影具罗字爱击流备兵连调深商算质团集百需价花党华城石级整府离况亚请技际约示复病息究线似官"
        "火断精满支视消越器容照须九增研写称企八功吗包片史委乎查轻易早曾除农找装广显吧阿李标谈吃图念六引历"
        "首医局突专费号尽另周较注语仅考落青随选列武红响虽推势参希古众构房半节土投某案黑维革划敌致陈律足态"
        "护七兴派孩验责营星够章音跟志底站严巴例防族供效续施留讲型料终答紧黄绝奇察母京段依批群项故按河米围"
        "江织害斗双境客纪采举杀攻父苏密低朝友诉止细愿千值仍男钱破网热助倒育属坐帝限船脸职速刻乐否刚威毛状"
        "率甚独球般普怕弹校苦创假久错承印晚兰试股拿脑预谁益阳若哪微尼继送急血惊伤素药适波夜省初喜卫源食险"
        "待述陆习置居劳财环排福纳欢雷警获模充负云停木游龙树疑层冷洲冲射略范竟句室异激汉村哈策演简卡罪判担"
        "州静退既衣您宗积余痛检差富灵协角占配征修皮挥胜降阶审沉坚善妈刘读啊超免压银买皇养伊怀执副乱抗犯追"
        "帮宣佛岁航优怪香著田铁控税左右份穿艺背阵草脚概恶块顿敢守酒岛托央户烈洋哥索胡款靠评版宝座释景顾弟"
        "登货互付伯慢欧换闻危忙核暗姐介坏讨丽良序升监临亮露永呼味野架域沙掉括舰鱼杂误湾吉减编楚肯测败屋跑"
        "梦散温困剑渐封救贵枪缺楼县尚毫移娘朋画班智亦耳恩短掌恐遗固席松秘谢鲁遇康虑幸均销钟诗藏赶剧票损忽"
        "巨炮旧端探湖录叶春乡附吸予礼港雨呀板庭妇归睛饭额含顺输摇招婚脱补谓督毒油疗旅泽材灭逐莫笔亡鲜词圣"
        "择寻厂睡博勒烟授诺伦岸奥唐卖俄炸载洛健堂旁宫喝借君禁阴园谋宋避抓荣姑孙逃牙束跳顶玉镇雪午练迫爷篇"
        "肉嘴馆遍凡础洞卷坦牛宁纸诸训私庄祖丝翻暴森塔默握戏隐熟骨访弱蒙歌店鬼软典欲萨伙遭盘爸扩盖弄雄稳忘"
        "亿刺拥徒姆杨齐赛趣曲刀床迎冰虚玩析窗醒妻透购替塞努休虎扬途侵刑绿兄迅套贸毕唯谷轮库迹尤竞街促延震"
        "弃甲伟麻川申缓潜闪售灯针哲络抵朱埃抱鼓植纯夏忍页杰筑折郑贝尊吴秀混臣雅振染盛怒舞圆搞狂措姓残秋培"
        "迷诚宽宇猛摆梅毁伸摩盟末乃悲拍丁赵硬麦蒋操耶阻订彩抽赞魔纷沿喊违妹浪汇币丰蓝殊献桌啦瓦莱援译夺汽"
        "烧距裁偏符勇触课敬哭懂墙袭召罚侠厅拜巧侧韩冒债曼融惯享戴童犹乘挂奖绍厚纵障讯涉彻刊丈爆乌役描洗玛"
        "患妙镜唱烦签仙彼弗症仿倾牌陷鸟轰咱菜闭奋庆撤泪茶疾缘播朗杜奶季丹狗尾仪偷奔珠虫驻孔宜艾桥淡翼恨繁"
        "寒伴叹旦愈潮粮缩罢聚径恰挑袋灰捕徐珍幕映裂泰隔启尖忠累炎暂估泛荒偿横拒瑞忆孤鼻闹羊呆厉衡胞零穷舍"
        "码赫婆魂灾洪腿胆津俗辩胸晓劲贫仁偶辑邦恢赖圈摸仰润堆碰艇稍迟辆废净凶署壁御奉旋冬矿抬蛋晨伏吹鸡倍"
        "糊秦盾杯租骑乏隆诊奴摄丧污渡旗甘耐凭扎抢绪粗肩梁幻菲皆碎宙叔岩荡综爬荷悉蒂返井壮薄悄扫敏碍殖详迪"
        "矛霍允幅撒剩凯颗骂赏液番箱贴漫酸郎腰舒眉忧浮辛恋餐吓挺励辞艘键伍峰尺昨黎辈贯侦滑券崇扰宪绕趋慈乔"
        "阅汗枝拖墨胁插箭腊粉泥氏彭拔骗凤慧媒佩愤扑龄驱惜豪掩兼跃尸肃帕驶堡届欣惠册储飘桑闲惨洁踪勃宾频仇"
        "磨递邪撞拟滚奏巡颜剂绩贡疯坡瞧截燃焦殿伪柳锁逼颇昏劝呈搜勤戒驾漂饮曹朵仔柔俩孟腐幼践籍牧凉牲佳娜"
        "浓芳稿竹腹跌逻垂遵脉貌柏狱猜怜惑陶兽帐饰贷昌叙躺钢沟寄扶铺邓寿惧询汤盗肥尝匆辉奈扣廷澳嘛董迁凝慰"
        "厌脏腾幽怨鞋丢埋泉涌辖躲晋紫艰魏吾慌祝邮吐狠鉴曰械咬邻赤挤弯椅陪割揭韦悟聪雾锋梯猫祥阔誉筹丛牵鸣"
        "沈阁穆屈旨袖猎臂蛇贺柱抛鼠瑟戈牢逊迈欺吨琴衰瓶恼燕仲诱狼池疼卢仗冠粒遥吕玄尘冯抚浅敦纠钻晶岂峡苍"
        "喷耗凌敲菌赔涂粹扁亏寂煤熊恭湿循暖糖赋抑秩帽哀宿踏烂袁侯抖夹昆肝擦猪炼恒慎搬纽纹玻渔磁铜齿跨押怖"
        "漠疲叛遣兹祭醉拳弥斜档稀捷肤疫肿豆削岗晃吞宏癌肚隶履涨耀扭坛拨沃绘伐堪仆郭牺歼墓雇廉契拼惩捉覆刷"
        "劫嫌瓜歇雕闷乳串娃缴唤赢莲霸桃妥瘦搭赴岳嘉舱俊址庞耕锐缝悔邀玲惟斥宅添挖呵讼氧浩羽斤酷掠妖祸侍乙"
        "妨贪挣汪尿莉悬唇翰仓轨枚盐览傅帅庙芬屏寺胖璃愚滴疏萧姿颤丑劣柯寸扔盯辱匹俱辨饿蜂哦腔郁溃谨糟葛苗"
        "肠忌溜鸿爵鹏鹰笼丘桂滋聊挡纲肌茨壳痕碗穴膀卓贤卧膜毅锦欠哩函茫昂薛皱夸豫胃舌剥傲拾窝睁携陵哼棉晴"
        "铃填饲渴吻扮逆脆喘罩卜炉柴愉绳胎蓄眠竭喂傻慕浑奸扇柜悦拦诞饱乾泡贼亭夕爹酬儒姻卵氛泄杆挨僧蜜吟猩"
        "遂狭肖甜霞驳裕顽於摘矮秒卿畜咽披辅勾盆疆赌塑畏吵囊嗯泊肺骤缠冈羞瞪吊贾漏斑涛悠鹿俘锡卑葬铭滩嫁催"
        "璇翅盒蛮矣潘歧赐鲍锅廊拆灌勉盲宰佐啥胀扯禧辽抹筒棋裤唉朴咐孕誓喉妄拘链驰栏逝窃艳臭纤玑棵趁匠盈翁"
        "愁瞬婴孝颈倘浙谅蔽畅赠妮莎尉冻跪闯葡後厨鸭颠遮谊圳吁仑辟瘤嫂陀框谭亨钦庸歉芝吼甫衫摊宴嘱衷娇陕矩"
        "浦讶耸裸碧摧薪淋耻胶屠鹅饥盼脖虹翠崩账萍逢赚撑翔倡绵猴枯巫昭怔渊凑溪蠢禅阐旺寓藤匪伞碑挪琼脂谎慨"
        "菩萄狮掘抄岭晕逮砍掏狄晰罕挽脾舟痴蔡剪脊弓懒叉拐喃僚捐姊骚拓歪粘柄坑陌窄湘兆崖骄刹鞭芒筋聘钩棍嚷"
        "腺弦焰耍俯厘愣厦恳饶钉寡憾摔叠惹喻谱愧煌徽溶坠煞巾滥洒堵瓷咒姨棒郡浴媚稣淮哎屁漆淫巢吩撰啸滞玫硕"
        "钓蝶膝姚茂躯吏猿寨恕渠戚辰舶颁惶狐讽笨袍嘲啡泼衔倦涵雀旬僵撕肢垄夷逸茅侨舆窑涅蒲谦杭噢弊勋刮郊凄"
        "捧浸砖鼎篮蒸饼亩肾陡爪兔殷贞荐哑炭坟眨搏咳拢舅昧擅爽咖搁禄雌哨巩绢螺裹昔轩谬谍龟媳姜瞎冤鸦蓬巷琳"
        "栽沾诈斋瞒彪厄咨纺罐桶壤糕颂膨谐垒咕隙辣绑宠嘿兑霉挫稽辐乞纱裙嘻哇绣杖塘衍轴攀膊譬斌祈踢肆坎轿棚"
        "泣屡躁邱凰溢椎砸趟帘帆栖窜丸斩堤塌贩厢掀喀乖谜捏阎滨虏匙芦苹卸沼钥株祷剖熙哗劈怯棠胳桩瑰娱娶沫嗓"
        "蹲焚淘嫩韵衬匈钧竖峻豹捞菊鄙魄兜哄颖镑屑蚁壶怡渗秃迦旱哟咸焉谴宛稻铸锻伽詹毙恍贬烛骇芯汁桓坊驴朽"
        "靖佣汝碌迄冀荆崔雁绅珊榜诵傍彦醇笛禽勿娟瞄幢寇睹贿踩霆呜拱妃蔑谕缚诡篷淹腕煮倩卒勘馨逗甸贱炒灿敞"
        "蜡囚栗辜垫妒魁谣寞蜀甩涯枕丐泳奎泌逾叮黛燥掷藉枢憎鲸弘倚侮藩拂鹤蚀浆芙垃烤晒霜剿蕴圾绸屿氢驼妆捆"
        "铅逛淑榴丙痒钞蹈疙")


def build(root: str | Path, size: Size = "tiny", seed: int = 0) -> dict[str, str]:
    """Write a random checkpoint under ``root`` (``root/asset/...``) and return its sha256 map (also
    written to ``root/sha256_map.json``, which the loader picks up for ``source="custom"``)."""
    import torch

    torch.manual_seed(seed)
    root = Path(root)
    asset = root / "asset"
    (asset / "gpt").mkdir(parents=True, exist_ok=True)
    arch = _arch(size)
    vocab = _write_tokenizer(asset / "tokenizer")
    if size == "tiny":
        arch["gpt"]["num_text_tokens"] = arch["embed"]["num_text_tokens"] = len(vocab)
    with torch.no_grad():
        _write_modules(asset, arch)
    if size == "tiny":
        (root / ARCH_FILE).write_text(json.dumps(arch, indent=1), "utf-8")
    sha = {_sha_key(name): _sha256(root / name) for name in ASSET_FILES}
    (root / SHA256_FILE).write_text(json.dumps(sha, indent=1), "utf-8")
    log.info("random %s ChatTTS checkpoint written to %s", size, root)
    return sha


def _sha_key(name: str) -> str:
    # asset/gpt/config.json -> sha256_asset_gpt_config_json (ChatTTS/utils/dl.py: check_folder)
    return "sha256_" + name.replace("/", "_").replace(".", "_")


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            h.update(block)
    return h.hexdigest()


def _arch(size: Size) -> dict[str, Any]:
    if size == "full":
        return {"gpt": {"hidden_size": 768, "intermediate_size": 3072, "num_attention_heads": 12,
                        "num_hidden_layers": 20, "use_cache": False, "max_position_embeddings": 4096,
                        "spk_emb_dim": 192, "spk_KL": False, "num_audio_tokens": 626,
                        "num_text_tokens": 21178, "num_vq": 4},
                "embed": {"hidden_size": 768, "num_audio_tokens": 626, "num_text_tokens": 21178, "num_vq": 4},
                "decoder": {"idim": 384, "odim": 384, "hidden": 512, "n_layer": 12, "bn_dim": 128},
                "dvae": {"encoder": {"idim": 512, "odim": 1024, "hidden": 256, "n_layer": 12, "bn_dim": 128},
                         "decoder": {"idim": 512, "odim": 512, "hidden": 256, "n_layer": 12, "bn_dim": 128},
                         "vq": {"dim": 1024, "levels": [5, 5, 5, 5], "G": 2, "R": 2}},
                "vocos": {"backbone": {"input_channels": 100, "dim": 512, "intermediate_dim": 1536,
                                       "num_layers": 8},
                          "head": {"dim": 512, "n_fft": 1024, "hop_length": 256, "padding": "center"}}}
    hidden = 64
    # Shape rules (FACTS): decoder.idim == decoder.odim == gpt_hidden/2; dvae.vq.dim == 2 * dvae.decoder.idim
    # == dvae.encoder.odim; VQ levels (5,5,5,5) with G=R=2 (626 audio tokens, 4 codebooks); 100 mel bins.
    return {"gpt": {"hidden_size": hidden, "intermediate_size": 128, "num_attention_heads": 2,
                    "num_hidden_layers": 2, "use_cache": False, "max_position_embeddings": 4096,
                    "spk_emb_dim": 16, "spk_KL": False, "num_audio_tokens": 626,
                    "num_text_tokens": 0, "num_vq": 4},
            "embed": {"hidden_size": hidden, "num_audio_tokens": 626, "num_text_tokens": 0, "num_vq": 4},
            "decoder": {"idim": hidden // 2, "odim": hidden // 2, "hidden": 48, "n_layer": 3, "bn_dim": 16},
            "dvae": {"encoder": {"idim": 16, "odim": 32, "hidden": 32, "n_layer": 1, "bn_dim": 16},
                     "decoder": {"idim": 16, "odim": 16, "hidden": 32, "n_layer": 1, "bn_dim": 16},
                     "vq": {"dim": 32, "levels": [5, 5, 5, 5], "G": 2, "R": 2}},
            "vocos": {"backbone": {"input_channels": 100, "dim": 48, "intermediate_dim": 96, "num_layers": 2},
                      "head": {"dim": 48, "n_fft": 1024, "hop_length": 256, "padding": "center"}},
            "spk_stat": _spk_stat(hidden)}


def _spk_stat(dim: int) -> str:
    """ChatTTS's speaker statistics string (std then mean, float16, base16384) for a hidden size."""
    import numpy as np
    import pybase16384 as b14

    std = np.full(dim, 0.5, dtype=np.float16)
    mean = np.zeros(dim, dtype=np.float16)
    return str(b14.encode_to_string(np.concatenate([std, mean]).tobytes()))


def _write_tokenizer(directory: Path) -> list[str]:
    from transformers import BertTokenizerFast  # type: ignore[attr-defined]  # lazy export

    directory.mkdir(parents=True, exist_ok=True)
    letters = [chr(c) for c in range(ord("a"), ord("z") + 1)]
    punct = list("，。、,.!?！？；;：:'\"-“”‘’（）() ")
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *SPECIAL_TOKENS, *letters,
             *(f"##{c}" for c in letters), *"0123456789", *(p for p in punct if p.strip())]
    vocab += [c for c in dict.fromkeys(_CJK) if c not in vocab]
    vocab_file = directory / "vocab.txt"
    vocab_file.write_text("\n".join(vocab) + "\n", "utf-8")
    tok = BertTokenizerFast(vocab_file=str(vocab_file), do_lower_case=True,
                            additional_special_tokens=list(SPECIAL_TOKENS))
    tok.save_pretrained(str(directory))
    # transformers 5 no longer writes special_tokens_map.json, which ChatTTS's asset check requires.
    special = {"unk_token": "[UNK]", "sep_token": "[SEP]", "pad_token": "[PAD]", "cls_token": "[CLS]",
               "mask_token": "[MASK]", "additional_special_tokens": list(SPECIAL_TOKENS)}
    (directory / "special_tokens_map.json").write_text(json.dumps(special, indent=1), "utf-8")
    return vocab


def _write_modules(asset: Path, arch: dict[str, Any]) -> None:
    from dataclasses import asdict

    import torch
    from ChatTTS.config import Config
    from ChatTTS.model.dvae import DVAE, ConvNeXtBlock
    from ChatTTS.model.embed import Embed
    from safetensors.torch import save_file
    from transformers import LlamaConfig, LlamaModel
    from vocos import Vocos
    from vocos.pretrained import instantiate_class

    from workers.engines.chattts.architecture import apply_arch

    config = Config()
    apply_arch(config, arch)

    def save(module: torch.nn.Module, name: str) -> None:
        state = {k: v.detach().contiguous() for k, v in module.state_dict().items()}
        save_file(state, str(asset / name))

    def liven(module: torch.nn.Module) -> None:
        # ConvNeXt layer scales start at 1e-6, which makes every block an identity and the receptive
        # field a few frames. Trained models are far from that; 0.1 makes the windowed decoding face a
        # realistic receptive field.
        for m in module.modules():
            if isinstance(m, ConvNeXtBlock) and m.weight is not None:
                m.weight.fill_(0.1)

    vocos = Vocos(feature_extractor=instantiate_class(args=(), init=asdict(config.vocos.feature_extractor)),
                  backbone=instantiate_class(args=(), init=asdict(config.vocos.backbone)),
                  head=instantiate_class(args=(), init=asdict(config.vocos.head)))
    save(vocos, "Vocos.safetensors")
    dvae = DVAE(decoder_config=asdict(config.dvae.decoder), encoder_config=asdict(config.dvae.encoder),
                vq_config=asdict(config.dvae.vq), dim=config.dvae.decoder.idim)
    liven(dvae)
    save(dvae, "DVAE.safetensors")
    decoder = DVAE(decoder_config=asdict(config.decoder), dim=config.decoder.idim)
    liven(decoder)
    save(decoder, "Decoder.safetensors")
    g = config.gpt
    embed = Embed(g.hidden_size, g.num_audio_tokens, g.num_text_tokens, g.num_vq)
    # nn.Embedding starts at N(0, 1): token vectors of norm sqrt(hidden) would drown the unit-norm speaker
    # embedding ChatTTS writes at [spk_emb], and every voice would sound the same. Unit-scale them.
    for table in (embed.emb_text, *embed.emb_code):
        table.weight.normal_(0.0, g.hidden_size ** -0.5)
    save(embed, "Embed.safetensors")
    gpt_args = {k: v for k, v in asdict(g).items()
                if k not in {"spk_emb_dim", "spk_KL", "num_audio_tokens", "num_text_tokens", "num_vq"}}
    # embed_tokens is deleted by ChatTTS after loading (it embeds through Embed): keep it one row.
    llama = LlamaModel(LlamaConfig(**gpt_args, vocab_size=1, bos_token_id=None, eos_token_id=None,
                                    pad_token_id=None))
    llama.save_pretrained(str(asset / "gpt"), safe_serialization=True)


def main(argv: list[str] | None = None) -> None:
    """``python -m workers.engines.chattts.random_checkpoint DIR [--size tiny|full]``: for end-to-end
    tests and benchmarks elsewhere (then ``--engine chattts`` with source ``custom`` and that dir)."""
    import argparse

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("directory")
    ap.add_argument("--size", choices=["tiny", "full"], default="tiny")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    build(args.directory, args.size, args.seed)
    print(args.directory)


if __name__ == "__main__":
    main()
